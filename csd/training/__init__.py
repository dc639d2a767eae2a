"""Training the embedded models: the trainer (data parallel, EMA, resume, RNG state), the text and xAR
pairs' model builders, and growing a trained MAR deeper without changing what it computes."""
