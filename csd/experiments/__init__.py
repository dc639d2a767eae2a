"""Experiments on model pairs: which pairs exist and the default setting, evaluation, the benchmark,
the analysis panels, FID, and stoppable runs with progress."""
