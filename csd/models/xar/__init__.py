"""xAR (Ren et al., 2025): next-cell prediction with flow matching. The network (:mod:`.network`), the
official sampler as chains over cells (:mod:`.chains`), the samplers' view of it (:mod:`.adapter`) and
the official checkpoint loader (:mod:`.official`); :data:`FAMILY` is its row in
:data:`csd.models.registry.FAMILIES`."""

from csd.models.spec import Family
from csd.models.xar.adapter import XARFamily, cfg_ramp
from csd.models.xar.chains import CellChain, CellCondition, CellFlow, JoinedCells, SelectedCells, flow_times
from csd.models.xar.network import XAR, XAR_CONFIGS, XARConfig, block_causal_mask, cell_order, xar_config
from csd.models.xar.official import OFFICIAL_FILES, from_checkpoints, load_official_xar

FAMILY = Family(
    arch="xar",
    model=XAR,
    config=XARConfig,
    presets=XAR_CONFIGS,
    traits=XARConfig.traits,
    official_files=OFFICIAL_FILES,
    load_official=from_checkpoints,
)

__all__ = [
    "FAMILY",
    "XAR",
    "XAR_CONFIGS",
    "CellChain",
    "CellCondition",
    "CellFlow",
    "JoinedCells",
    "SelectedCells",
    "XARConfig",
    "XARFamily",
    "block_causal_mask",
    "cell_order",
    "cfg_ramp",
    "flow_times",
    "load_official_xar",
    "xar_config",
]
