"""Harmon (Wu et al., 2025): a MAR generator conditioned on a causal LLM. The network (:mod:`.network`,
with MAR's adapter), its prompts and tokenizers (:mod:`.prompt_batch`) and the official checkpoint loader
(:mod:`.official`); :data:`FAMILY` is its row in :data:`csd.models.registry.FAMILIES`."""

from csd.models.harmon.network import HARMON_CONFIGS, Harmon, HarmonConfig, harmon_config, qwen2
from csd.models.harmon.official import OFFICIAL_FILES, from_checkpoints, load_official_harmon
from csd.models.harmon.prompt_batch import HubTokenizer, Prompts, WordTokenizer, tokenizer_from_dict
from csd.models.spec import Family


def _build(config: HarmonConfig, meta) -> Harmon:
    if not isinstance(meta.get("tokenizer"), dict):
        raise ValueError('missing the "tokenizer" object')
    return Harmon(config, tokenizer_from_dict(meta["tokenizer"]))


FAMILY = Family(
    arch="harmon",
    model=Harmon,
    config=HarmonConfig,
    presets=HARMON_CONFIGS,
    traits=HarmonConfig.traits,
    build=_build,
    entries=lambda model: {"tokenizer": model.tokenizer.to_dict()},
    official_files=OFFICIAL_FILES,
    load_official=from_checkpoints,
)

__all__ = [
    "FAMILY",
    "HARMON_CONFIGS",
    "Harmon",
    "HarmonConfig",
    "HubTokenizer",
    "Prompts",
    "WordTokenizer",
    "harmon_config",
    "load_official_harmon",
    "qwen2",
    "tokenizer_from_dict",
]
