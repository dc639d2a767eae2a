"""Experiments on model pairs: the default setting, evaluation, the benchmark and its frontiers, the analysis
panels, FID, the roofline, and paper-scale timing."""
