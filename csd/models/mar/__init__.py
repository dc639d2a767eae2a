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
from csd.models.spec import Family

FAMILY = Family(
    arch="mar",
    model=MAR,
    config=MARConfig,
    presets=MAR_CONFIGS,
    traits=MARConfig.traits,
    official_files=OFFICIAL_FILES,
    load_official=from_checkpoints,
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
