"""Serving model pairs: where each pair is, loading it once, decoding its tokens to images, and long runs
that report progress per AR step and stop between two steps."""
