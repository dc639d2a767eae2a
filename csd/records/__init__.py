"""Records read without a model: the analysis panels' data, a run's replay frames, the cost model of a run,
and the verdicts of a quality-time frontier. Figures (:mod:`visualize`) and the app draw these."""
