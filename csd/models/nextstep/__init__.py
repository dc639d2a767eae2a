"""NextStep-1 (StepFun, 2025): causal next-token prediction with a flow-matching head. The network
(:mod:`.network`, the official module tree), its flow sampler as chains (:mod:`.flow`), the samplers' view of
it (:mod:`.adapter`), its cache and ``use_norm`` (:mod:`.tokens`), the official checkpoint loader
(:mod:`.official`) and its image tokenizer, the FLUX VAE (:mod:`csd.models.flux_vae`); :data:`FAMILY` is its row in
:data:`csd.models.registry.FAMILIES`."""

from csd.models.harmon.prompt_batch import tokenizer_from_dict
from csd.models.nextstep.adapter import CausalPrompts, NextStepFamily, NextStepState, cfg_scales
from csd.models.nextstep.flow import FlowChain, flow_grid
from csd.models.nextstep.network import NEXTSTEP_CONFIGS, NextStep, NextStepConfig
from csd.models.nextstep.official import (
    OFFICIAL_FILES,
    from_checkpoints,
    image_tokenizer_from_checkpoints,
    load_official_nextstep,
)
from csd.models.nextstep.tokens import KVCache, NormedTokens, token_norm
from csd.models.spec import Family


def _build(config: NextStepConfig, meta) -> NextStep:
    if not isinstance(meta.get("tokenizer"), dict):
        raise ValueError('missing the "tokenizer" object')
    return NextStep(config, tokenizer_from_dict(meta["tokenizer"]))


FAMILY = Family(
    arch="nextstep",
    model=NextStep,
    config=NextStepConfig,
    presets=NEXTSTEP_CONFIGS,
    traits=NextStepConfig.traits,
    build=_build,
    entries=lambda model: {"tokenizer": model.tokenizer.to_dict()},
    official_files=OFFICIAL_FILES,
    load_official=from_checkpoints,
    official_tokenizer=image_tokenizer_from_checkpoints,
)

__all__ = [
    "FAMILY",
    "NEXTSTEP_CONFIGS",
    "CausalPrompts",
    "FlowChain",
    "KVCache",
    "NextStep",
    "NextStepConfig",
    "NextStepFamily",
    "NextStepState",
    "NormedTokens",
    "cfg_scales",
    "flow_grid",
    "load_official_nextstep",
    "token_norm",
]
