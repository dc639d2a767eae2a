"""What a trainer writes and reads back: the shipped EMA weights with their ``train`` summary, the train state
that ``--resume`` continues from (weights, EMA, optimizer, step and every generator's state), and the starts
from other files (another run's train state, a shipped model)."""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, fields
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor, nn

from csd.models.checkpoint import CheckpointError, file_digest, load_state_strict, safe_torch_load
from csd.models.registry import load_model, save_model, weights_path

# Fields that may change when resuming; every other field must equal the saved run's.
# ``precision`` and ``cooldown_steps`` may change too: a run can switch to bf16 autocast or get a final LR
# cool-down when it is extended (the steps already taken are unchanged).
RESUMABLE_CHANGES = frozenset(
    {
        "out",
        "steps",
        "threads",
        "device",
        "log_every",
        "save_every",
        "max_minutes",
        "resume",
        "precision",
        "cooldown_steps",
    }
)


class RunFiles:
    """Save and resume of a trainer (:class:`csd.training.trainer.Trainer`, which sets the attributes below,
    with ``cfg``: its ``TrainConfig``, ``dist``: its rank and world size, and ``_param_groups()``: its fresh
    optimizer groups). Under DDP every rank saves and loads its own generators; rank 0 writes the files."""

    device: torch.device
    model: nn.Module
    ema: nn.Module
    optimizer: torch.optim.Optimizer
    data_gen: torch.Generator
    model_gen: torch.Generator
    step: int
    elapsed: float
    loss: float
    parent: dict | None  # what init_from / init_weights started from
    teacher_digest: str | None

    def load_shipped(self, model: nn.Module, path: str | Path) -> None:
        """Copy a shipped model's weights into ``model``; its architecture must be this run's."""
        start = load_model(path)
        if type(start) is not type(model) or start.config != model.config:
            raise ValueError(f"init_weights {path}: its architecture differs from {self.cfg.config}'s")
        model.load_state_dict(start.state_dict())
        record = json.loads(weights_path(path).with_suffix(".json").read_text())
        self.parent = {"path": str(path), "file_digest": file_digest(weights_path(path)), "train": record.get("train")}

    def rng_state(self) -> dict[str, Tensor]:
        state = {
            "data": self.data_gen.get_state(),
            "model": self.model_gen.get_state(),
            "global": torch.get_rng_state(),
        }
        if self.device.type == "cuda":
            state["cuda"] = torch.cuda.get_rng_state(self.device)
        return state

    def state_dict(self) -> dict:
        """The resumable state; a collective call under DDP (it gathers every rank's generators)."""
        rngs = [self.rng_state()]
        if self.dist.world > 1:
            rngs = [None] * self.dist.world
            dist.all_gather_object(rngs, self.rng_state())
        return {
            "step": self.step,
            "elapsed": self.elapsed,
            "loss": self.loss,
            "world_size": self.dist.world,
            "args": asdict(self.cfg),
            "model": self.model.state_dict(),
            "ema": self.ema.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "rng": rngs,
            "parent": self.parent,
        }

    def summary(self) -> dict:
        """The ``train`` entry of the checkpoint JSON."""
        return {
            "args": asdict(self.cfg),
            "steps_done": self.step,
            "world_size": self.dist.world,
            "global_batch_size": self.cfg.batch_size * self.dist.world,
            "wall_time_s": round(self.elapsed, 1),
            "final_loss": None if math.isnan(self.loss) else self.loss,
            "device": self.device.type,
            "torch": torch.__version__,
            **({"distill_from_digest": self.teacher_digest} if self.teacher_digest else {}),
            **({"parent": self.parent} if self.parent else {}),
        }

    def save(self) -> None:
        state = self.state_dict()
        if not self.dist.main:
            return
        paths = self.cfg.paths
        save_model(self.ema, paths["weights"], {"train": self.summary()})
        tmp = paths["state"].with_name(paths["state"].name + ".tmp")
        torch.save(state, tmp)
        os.replace(tmp, paths["state"])  # a run killed mid-save keeps the previous state

    def _load_weights(self, state: dict, path: str | Path) -> None:
        """Raw weights, EMA and AdamW state from a train state; mismatches are errors naming the file."""
        load_state_strict(self.model, state["model"], str(path))
        load_state_strict(self.ema, state["ema"], str(path))
        try:
            self.optimizer.load_state_dict(state["optimizer"])
        except (KeyError, ValueError) as exc:
            raise CheckpointError(f"optimizer state in {path} does not match the model: {exc}") from exc

    def init_from(self, path: str | Path) -> None:
        """Start this (fresh) run from the weights, EMA and AdamW moments of another run's train state.

        The architecture must match (a shape mismatch is an error naming the file); training settings such
        as the mask-ratio distribution, LR and steps may differ. Step count, schedule and generators start
        anew from this run's settings."""
        state = safe_torch_load(path)
        for key in ("model", "ema", "optimizer", "step", "args"):
            if key not in state:
                raise CheckpointError(f"{path} is not a train state written by csd.training.trainer (no {key!r})")
        self._load_weights(state, path)
        # The loaded groups carry the parent's settings: this run's weight decay and LR multipliers instead.
        for group, fresh in zip(self.optimizer.param_groups, self._param_groups(), strict=True):
            group["weight_decay"], group["lr_mult"] = fresh["weight_decay"], fresh["lr_mult"]
        self.parent = {
            "path": str(path),
            "args": state["args"],
            "steps_done": state["step"],
            "wall_time_s": round(float(state.get("elapsed", 0.0)), 1),
            "parent": state.get("parent"),
        }

    def load(self, path: str | Path) -> None:
        """Continue from a train state written by :meth:`save` with the same settings and world size."""
        state = safe_torch_load(path)
        saved = state.get("args", {})
        changed = sorted(
            f.name
            for f in fields(self.cfg)
            # A field the saved run predates had its default there.
            if f.name not in RESUMABLE_CHANGES and saved.get(f.name, f.default) != getattr(self.cfg, f.name)
        )
        if changed:
            diffs = ", ".join(f"{k}: {saved.get(k)!r} -> {getattr(self.cfg, k)!r}" for k in changed)
            raise ValueError(f"cannot resume from {path}: settings differ ({diffs})")
        if state["world_size"] != self.dist.world:
            raise ValueError(
                f"cannot resume from {path}: saved with {state['world_size']} processes, not {self.dist.world}"
            )
        self._load_weights(state, path)
        rng = state["rng"][self.dist.rank]
        self.data_gen.set_state(rng["data"])
        self.model_gen.set_state(rng["model"])
        torch.set_rng_state(rng["global"])
        if "cuda" in rng:
            torch.cuda.set_rng_state(rng["cuda"], self.device)
        self.step, self.elapsed, self.loss = state["step"], state["elapsed"], state["loss"]
        self.parent = state.get("parent")
        if self.dist.main:
            self._truncate_log()

    def _truncate_log(self) -> None:
        """Drop log records past the resumed step (a run killed between saves logged steps it will redo)."""
        path = self.cfg.paths["log"]
        if not path.exists():
            return
        lines = path.read_text().splitlines()
        keep = [line for line in lines if line.strip() and json.loads(line)["step"] <= self.step]
        if len(keep) != len(lines):
            path.write_text("".join(line + "\n" for line in keep))
