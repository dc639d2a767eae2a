"""The embedded world: procedural shapes and captions, their classifier, probes and metrics. Nothing in the
method depends on it; the embedded models are trained on it (:mod:`csd.training`)."""
