"""Paper scale: CSD against target-only decoding at the official model sizes, timed side by side in one process.

    python -m csd.experiments.paper_scale [--families mar xar harmon] [--pairs H/B L/B] [--batches 1 8 64 256]
        [--gammas 8 16 32] [--checkpoints DIR] [--device auto|cpu|cuda] [--out bench/results/gpu]
    python -m csd.experiments.paper_scale --dry-run --estimate-device h200 --budget-s 600   # plan + estimate only
    python -m csd.experiments.paper_scale --tiny                                          # the same path, tiny

The setting of Table 1 of Continuous Speculative Decoding (Wang et al., arXiv 2411.11925): a large target and
a small draft of one family (MAR-H / MAR-B and MAR-L / MAR-B, and the same pairs of xAR; Harmon-1.5B /
Harmon-0.5B), batch 1 to 256, draft length gamma 8 / 16 / 32. Without ``--checkpoints`` the models have seeded
random weights at the official sizes: the timings are real (a pass costs what it costs whatever the weights),
acceptance and image quality mean nothing, and every output says so.

Every family-specific fact comes from the family's row (:class:`csd.models.spec.Family`) and its catalog
entry (:class:`csd.serving.catalog.Entry`): its paper pairs (the "official"
:class:`~csd.serving.catalog.PairSpec` rows with a ``key``) and its :class:`~csd.models.spec.PaperScale`
(published sampler, the configs built, the cost shape of the estimate; the sources of the published settings
are in each family's ``paper.py``). The modules, in the order a run uses them:

* :mod:`.plan`: the pairs, their published samplers, the grid of batches and draft lengths, its cells;
* :mod:`.build`: building (seeded random weights, or shrunk by ``--tiny``) or loading a pair, and its
  conditions;
* :mod:`.measure`: one cell timed (interleaved repeats, device synchronisation, peak memory) into rows;
* :mod:`.projection`: the dry run's run-time model (FLOPs, weight reads, kernel launches per device profile);
* :mod:`.run`: every cell of a run, skipping what cannot run, saving after each;
* :mod:`.markdown`: the plan and the results as Markdown;
* :mod:`.command`: the command line.

Timing reuses :mod:`csd.experiments.timing` (interleaved repeats after a warm-up, medians, per-round ratio
spread, per-pass costs from the traces, phase shares) and :mod:`csd.records.cost` (the bound from the same run's
costs; a family whose verification runs one chain per block charges it once, ``head_per_block``). Backbones
run in bfloat16 on CUDA; the library keeps heads and densities in float32, and ``--heads bfloat16`` autocasts
the heads too, as the published code samples. See docs/paper_scale.md.

Quality is not scored here: FID needs tens of thousands of images and real weights
(:mod:`csd.experiments.fid`); with random weights it means nothing.
"""
