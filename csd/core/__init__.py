"""The method's math, below the settings and the decoders: argument checks, seeded random streams, the
Gaussian overlap and the resampler, noise schedules, the token chain's trajectory, numeric precision, and
the one-token example of speculative sampling."""
