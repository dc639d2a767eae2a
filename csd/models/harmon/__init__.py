"""Harmon (Wu et al., 2025): a MAR generator conditioned on a causal LLM. The network (:mod:`.network`,
with MAR's adapter), its prompts and tokenizers (:mod:`.prompt_batch`) and the official checkpoint loader
(:mod:`.official`); :data:`FAMILY` is its row in :data:`csd.models.registry.FAMILIES`."""

from csd.models.harmon.network import HARMON_CONFIGS, Harmon, HarmonConfig, harmon_config, qwen2
from csd.models.harmon.official import OFFICIAL_FILES, from_checkpoints, load_official_harmon
from csd.models.harmon.paper import PAPER
from csd.models.harmon.prompt_batch import HubTokenizer, Prompts, WordTokenizer, tokenizer_from_dict
from csd.models.spec import Family, PairSpec, ResultsDocs


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
    pairs=(
        PairSpec(
            "shapes, text prompts (embedded, Harmon layout)",
            "harmon",
            "shapes_text_target",
            "shapes_text_draft",
            "embedded",
        ),
        # Harmon-1.5B's generator is MAR-H and Harmon-0.5B's MAR-B: the family's one pair, its H/B.
        PairSpec(
            "Harmon-1.5B / Harmon-0.5B (text)",
            "harmon",
            "harmon_1.5b",
            "harmon_0.5b",
            "official",
            key="H/B",
            paper_name="Harmon-1.5B / Harmon-0.5B",
            prompts=("a red fox in the snow", "a lighthouse at dusk, oil painting", "a bowl of ramen, top view"),
        ),
        PairSpec("random text (untrained)", "harmon", "random_text_target", "random_text_draft", "random"),
    ),
    paper=PAPER,
    docs=ResultsDocs("Harmon (text pair)", "text-", 1),
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
