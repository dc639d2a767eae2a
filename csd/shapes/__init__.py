"""The embedded world: procedural shapes, their classifier and metrics, and training, growing and probing
the embedded models. Nothing in the method depends on it."""
