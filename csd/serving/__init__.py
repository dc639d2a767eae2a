"""Serving model pairs: which pairs, papers and docs pages go with each family (the catalog), where each
pair is, loading it once, decoding its tokens to images, and long runs that report progress per AR step
and stop between two steps."""
