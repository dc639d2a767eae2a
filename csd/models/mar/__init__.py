"""MAR (Li et al., 2024): the network (:mod:`.network`), its adapter to the samplers (:mod:`.adapter`,
shared with Harmon) and the official checkpoint loader (:mod:`.official`); :data:`FAMILY` is its row in
:data:`csd.models.registry.FAMILIES`."""

from csd.models.mar.adapter import MaskedARFamily, check_labels, gather_rows
from csd.models.mar.network import (
    MAR,
    MAR_CONFIGS,
    MARConfig,
    mar_config,
    tiny_pixel_config,
    training_mask,
    truncated_normal_ratio,
)
from csd.models.mar.official import OFFICIAL_FILES, from_checkpoints, load_official_mar
from csd.models.mar.paper import PAPER
from csd.models.spec import Family, PairSpec, ResultsDocs

FAMILY = Family(
    arch="mar",
    model=MAR,
    config=MARConfig,
    presets=MAR_CONFIGS,
    traits=MARConfig.traits,
    official_files=OFFICIAL_FILES,
    load_official=from_checkpoints,
    pairs=(
        PairSpec("shapes (embedded)", "mar", "shapes_target", "shapes_draft", "embedded"),
        # Table 1 of the paper (MAR, ImageNet 256, gamma 32), as docs/DESIGN.md records it.
        PairSpec(
            "MAR-H / MAR-B (ImageNet)",
            "mar",
            "mar_huge",
            "mar_base",
            "official",
            key="H/B",
            paper_name="MAR-H / MAR-B",
            published="1.44x at batch 1, 2.17x at 128, 2.33x at 256 (gamma 32)",
        ),
        PairSpec(
            "MAR-L / MAR-B (ImageNet)",
            "mar",
            "mar_large",
            "mar_base",
            "official",
            key="L/B",
            paper_name="MAR-L / MAR-B",
            published="1.18x at batch 1 to 1.49x at 256 (gamma 32)",
        ),
        PairSpec("random (untrained)", "mar", "random_target", "random_draft", "random"),
    ),
    paper=PAPER,
    docs=ResultsDocs("MAR (class pair)", "", 0),
)

__all__ = [
    "FAMILY",
    "MAR",
    "MAR_CONFIGS",
    "MARConfig",
    "MaskedARFamily",
    "check_labels",
    "gather_rows",
    "load_official_mar",
    "mar_config",
    "tiny_pixel_config",
    "training_mask",
    "truncated_normal_ratio",
]
