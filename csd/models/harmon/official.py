"""Loading the official Harmon checkpoints (``harmon_0.5b.pth``, ``harmon_1.5b.pth`` from the Hub
repository ``wusize/harmon``) into :class:`csd.models.harmon.Harmon`.

The files are flat state dicts (``llm.model.*``, ``llm.lm_head.weight``, ``mar.*``, ``proj_in.*``,
``proj_out.*``; no VAE), read with ``torch.load(weights_only=True)`` and loaded strictly. The LLM's
architecture and tokenizer come from a local copy of its Hub files (Qwen2.5-0.5B-Instruct or
-1.5B-Instruct: ``config.json`` and the tokenizer files), never from the network::

    pretrained_models/harmon/
        harmon_0.5b.pth  harmon_1.5b.pth
        Qwen2.5-0.5B-Instruct/   config.json tokenizer.json tokenizer_config.json vocab.json merges.txt
        Qwen2.5-1.5B-Instruct/   (the same files)
    pretrained_models/vae/kl16.ckpt   (MAR's KL-16 VAE, shared with the MAR pairs)
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from csd.models.checkpoint import CheckpointError, load_state_strict, safe_torch_load
from csd.models.harmon.network import Harmon, HarmonConfig, harmon_config
from csd.models.harmon.prompt_batch import HubTokenizer

LLM_DIRS = {"harmon_0.5b": "Qwen2.5-0.5B-Instruct", "harmon_1.5b": "Qwen2.5-1.5B-Instruct"}
CHECKPOINTS = {"harmon_0.5b": "harmon_0.5b.pth", "harmon_1.5b": "harmon_1.5b.pth"}
LLM_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json")
# Relative to a checkpoint directory: the checkpoint, then its LLM's files.
OFFICIAL_FILES = {
    name: (f"harmon/{CHECKPOINTS[name]}", *(f"harmon/{LLM_DIRS[name]}/{f}" for f in LLM_FILES)) for name in CHECKPOINTS
}
# config.json keys -> the Qwen2Config fields the model is built from.
LLM_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
    "max_position_embeddings",
    "rope_theta",
    "rms_norm_eps",
    "tie_word_embeddings",
)


def check_llm_dir(directory: Path) -> dict:
    """The LLM's config from ``directory``; missing files are an error naming each of them."""
    missing = [name for name in LLM_FILES if not (directory / name).is_file()]
    if missing:
        raise CheckpointError(
            f"LLM directory {directory} lacks {', '.join(missing)} (it needs {', '.join(LLM_FILES)}: the "
            "Hub files of the Qwen2.5 Instruct model, see csd/models/harmon/official.py)"
        )
    try:
        config = json.loads((directory / "config.json").read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{directory / 'config.json'} is not JSON: {exc}") from exc
    absent = [k for k in LLM_KEYS if k not in config and k != "rope_theta"]
    if absent:
        raise CheckpointError(f"{directory / 'config.json'} lacks {', '.join(absent)}")
    return {k: config[k] for k in LLM_KEYS if k in config}


def load_official_harmon(
    checkpoint: str | Path, llm_dir: str | Path, config: str | HarmonConfig = "harmon_0.5b"
) -> Harmon:
    """Build ``config``'s Harmon (a name in HARMON_CONFIGS, or a config) with the LLM of ``llm_dir`` and
    load ``checkpoint`` strictly; eval mode, CPU."""
    checkpoint, llm_dir = Path(checkpoint), Path(llm_dir)
    name = config if isinstance(config, str) else "this config"
    base = harmon_config(config) if isinstance(config, str) else config
    llm = check_llm_dir(llm_dir)
    for key in ("hidden_size", "num_hidden_layers"):
        if llm[key] != base.llm[key]:
            files = f"the {LLM_DIRS[name]} files" if name in LLM_DIRS else "the matching LLM files"
            raise CheckpointError(
                f"{llm_dir / 'config.json'}: {key} {llm[key]} is not {name}'s ({base.llm[key]}): use {files}"
            )
    state = safe_torch_load(checkpoint)
    for wrapper in ("state_dict", "model"):  # a training-layout file wraps the flat dict
        if wrapper in state and isinstance(state[wrapper], dict):
            state = state[wrapper]
    if (
        llm.get("tie_word_embeddings")
        and "llm.lm_head.weight" not in state
        and "llm.model.embed_tokens.weight" in state
    ):
        state = {**state, "llm.lm_head.weight": state["llm.model.embed_tokens.weight"]}
    model = Harmon(replace(base, llm={**base.llm, **llm}), HubTokenizer(str(llm_dir)))
    load_state_strict(model, state, str(checkpoint))
    return model.eval()


def from_checkpoints(checkpoints: Path, name: str, target: Harmon | None = None) -> Harmon:
    """The official ``name`` model (a key of :data:`OFFICIAL_FILES`) from a checkpoint directory; a draft
    needs nothing of its ``target`` (:meth:`Harmon.check_draft` checks they read prompts alike)."""
    h = Path(checkpoints) / "harmon"
    return load_official_harmon(h / CHECKPOINTS[name], h / LLM_DIRS[name], name)
