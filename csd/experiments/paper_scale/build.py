"""The models of a paper-scale run: a pair built at the official sizes (or shrunk by --tiny) with seeded random
weights, or loaded from official checkpoints, and the conditions and seeds it is timed on."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from csd.models.registry import FAMILIES, build_model, family_of
from csd.serving.catalog import PairSpec, entry_of

RERANDOM_STD = 0.02  # zero-initialised layers get N(0, 0.02^2): otherwise every random head outputs zeros


def construct(family: str, name: str, tiny: bool, changes: dict | None = None) -> nn.Module:
    """An untrained model of the named config as the run builds it (its family's ``paper.overrides``, then
    ``changes``), on the current default device (a text family's LLM needs ``transformers``)."""
    paper = entry_of(family).paper
    return build_model(name, meta=paper.meta(tiny), **(paper.overrides(name, tiny) | (changes or {})))


def parameter_count(family: str, name: str, tiny: bool = False) -> int:
    """Parameters of a config, counted on the meta device (nothing is allocated)."""
    with torch.device("meta"):
        return sum(p.numel() for p in construct(family, name, tiny).parameters())


def random_model(family: str, name: str, seed: int, tiny: bool, changes: dict | None = None) -> nn.Module:
    """Seeded random weights on the CPU (the same on every machine): layer init under a forked, seeded
    global generator, then zero-initialised tensors redrawn from a seeded Generator."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = construct(family, name, tiny, changes)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if not p.any():
                p.normal_(0.0, RERANDOM_STD, generator=gen)
    return model


def official_pair(pair: PairSpec, checkpoints: Path) -> tuple[nn.Module, nn.Module]:
    """Target and draft from the official files (a family may match its draft to the target: xAR's flow steps)."""
    load = FAMILIES[pair.family].load_official
    target = load(checkpoints, pair.target)
    return target, load(checkpoints, pair.draft, target)


@dataclass(frozen=True)
class LoadedPair:
    spec: PairSpec
    target: nn.Module
    draft: nn.Module
    weights: str  # "random (seed S)" or "official"


def load_pair(pair: PairSpec, device: torch.device, seed: int, tiny: bool, checkpoints: Path | None) -> LoadedPair:
    """Official checkpoints where all of a pair's files exist under ``checkpoints`` (each family's layout,
    csd/models/<family>/official.py), else seeded random weights (the draft matched to its target where the
    family asks: xAR's on the target's flow steps)."""
    row = FAMILIES[pair.family]
    if checkpoints is not None and all(row.has_official(checkpoints, n) for n in (pair.target, pair.draft)):
        target, draft = official_pair(pair, checkpoints)
        weights = "official"
    else:
        target = random_model(pair.family, pair.target, seed, tiny)
        draft = random_model(pair.family, pair.draft, seed + 1, tiny, entry_of(pair.family).paper.match_draft(target))
        weights = f"random (seed {seed})"
    frozen = lambda m: m.to(device).eval().requires_grad_(False)
    return LoadedPair(pair, frozen(target), frozen(draft), weights)


def conditions_for(
    model: nn.Module, batch: int, seed: int, prompt_tokens: int, official: bool = False
) -> tuple[list, list[int]]:
    """Deterministic conditions and seeds: class labels drawn from a seeded Generator, or prompts of
    ``prompt_tokens`` tokens (random weights: the family's stand-in words; official weights: the prompt the
    published script uses)."""
    gen = torch.Generator().manual_seed(seed)
    seeds = list(range(seed, seed + batch))
    traits = model.traits
    if traits.conditions == "classes":
        return torch.randint(traits.num_classes, (batch,), generator=gen).tolist(), seeds
    paper = entry_of(family_of(model).arch).paper
    if official:
        return [paper.prompt] * batch, seeds
    return paper.stand_in_prompts(gen, batch, prompt_tokens - 1), seeds  # + the start token
