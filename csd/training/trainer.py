"""Train a pixel-token MAR on the procedural shapes dataset, in one process or under torchrun (DDP).

    python -m csd.training.trainer --config shapes_draft --out assets/models/shapes_draft --steps 8000
    torchrun --nproc_per_node=2 -m csd.training.trainer --config shapes_draft --out runs/draft --steps 100

Files written next to ``--out`` (a path without suffix):

* ``<out>.safetensors`` + ``<out>.json``: the EMA weights and their config, what
  :func:`csd.models.registry.load_model` reads;
* ``<out>.train_state.pt``: raw weights, EMA, optimizer, step and every generator state, for ``--resume``;
* ``<out>.log.jsonl``: one JSON line (step, loss, lr, elapsed seconds) every ``--log-every`` steps.

Every random number (model init, batches, flips, masks, diffusion noise) comes from generators seeded by
``--seed`` and the rank, so a resumed run continues exactly as an uninterrupted one would.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from csd.config import PRECISIONS as SAMPLING_PRECISIONS
from csd.core.checks import check_int
from csd.core.rng import drawing_from, stream_seed
from csd.models.checkpoint import file_digest
from csd.models.mar import MAR, MAR_CONFIGS, MARConfig, mar_config
from csd.models.registry import load_model, weights_path
from csd.models.tokenizer import PixelTokenizer, patchify
from csd.run_setup import check_pair
from csd.shapes.data import NUM_CLASSES, ShapesConfig, make_dataset
from csd.training.run_files import RunFiles

LR_SCHEDULES = ("constant", "cosine")
DEVICES = ("auto", "cpu", "cuda")
BETAS = (0.9, 0.95)  # MAR's AdamW betas
OUTPUT_SUFFIXES = {"weights": ".safetensors", "state": ".train_state.pt", "log": ".log.jsonl"}

# The samplers' precisions without float16 (which would need loss scaling): bfloat16 autocasts the forward
# pass; weights, optimizer and EMA stay float32.
PRECISIONS = {k: v for k, v in SAMPLING_PRECISIONS.items() if k not in ("float16", "float64")}


@dataclass(frozen=True)
class TrainConfig:
    """One training run. ``batch_size`` is per process; ``model_overrides`` replaces fields of the named config."""

    config: str
    out: str
    steps: int = 1000
    batch_size: int = 64
    lr: float = 5e-4
    lr_schedule: str = "constant"
    warmup_steps: int = 500
    cooldown_steps: int = 0  # linear decay to 0 over the last cooldown_steps steps (warm-up, stable, decay)
    weight_decay: float = 0.02
    grad_clip: float = 3.0
    ema_decay: float = 0.999
    data_size: int = 50_000
    data_seed: int = 0
    seed: int = 0
    hflip: bool = False
    model_overrides: dict = field(default_factory=dict)
    threads: int | None = None
    device: str = "auto"
    precision: str = "float32"
    log_every: int = 50
    save_every: int = 0
    max_minutes: float | None = None
    resume: bool = False
    # Start from another run's train state (weights, EMA and AdamW moments; a fresh step count, LR schedule
    # and generators): fine-tuning with changed settings, e.g. a new mask-ratio distribution or a re-warm-up.
    init_from: str | None = None
    # Start from a shipped model (.safetensors + .json): its weights as model and EMA, fresh AdamW moments,
    # step count, schedule and generators. How training continues where the train state was not kept.
    init_weights: str | None = None
    # Distillation: a frozen teacher model (.safetensors + .json) whose head outputs the student also
    # matches, at the same masks, labels and (x_t, t); distill_weight scales that term of the loss.
    distill_from: str | None = None
    distill_weight: float = 1.0

    def __post_init__(self) -> None:
        for name, lo in (("steps", 1), ("batch_size", 1), ("data_size", 1), ("log_every", 1)):
            _check_int(name, getattr(self, name), lo)
        for name in ("warmup_steps", "cooldown_steps", "save_every", "seed", "data_seed"):
            _check_int(name, getattr(self, name), 0)
        if self.threads is not None:
            _check_int("threads", self.threads, 1)
        if self.max_minutes is not None and not (math.isfinite(self.max_minutes) and self.max_minutes > 0):
            raise ValueError(f"TrainConfig.max_minutes must be a finite number > 0 or None, got {self.max_minutes!r}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"TrainConfig.lr must be a finite number > 0, got {self.lr!r}")
        for name in ("weight_decay", "grad_clip"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise ValueError(f"TrainConfig.{name} must be a finite number >= 0, got {getattr(self, name)!r}")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"TrainConfig.ema_decay must be in [0, 1), got {self.ema_decay!r}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"TrainConfig.lr_schedule must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"TrainConfig.precision must be one of {tuple(PRECISIONS)}, got {self.precision!r}")
        if self.cooldown_steps and self.lr_schedule != "constant":
            raise ValueError("TrainConfig.cooldown_steps needs lr_schedule='constant' (cosine already decays)")
        if self.cooldown_steps and self.warmup_steps + self.cooldown_steps > self.steps:
            raise ValueError(
                f"TrainConfig.warmup_steps + cooldown_steps must be <= steps ({self.steps}), "
                f"got {self.warmup_steps} + {self.cooldown_steps}"
            )
        if self.device not in DEVICES:
            raise ValueError(f"TrainConfig.device must be one of {DEVICES}, got {self.device!r}")
        if not self.out:
            raise ValueError("TrainConfig.out must be a non-empty path prefix")
        if self.distill_from is not None and not self.distill_from:
            raise ValueError("TrainConfig.distill_from must be a model path or None")
        w = self.distill_weight
        if not (isinstance(w, int | float) and math.isfinite(w) and w >= 0):
            raise ValueError(f"TrainConfig.distill_weight must be a finite number >= 0, got {w!r}")
        if self.init_from is not None and not self.init_from:
            raise ValueError("TrainConfig.init_from must be a train-state path or None")
        if self.init_weights is not None and not self.init_weights:
            raise ValueError("TrainConfig.init_weights must be a model path or None")
        if self.init_weights and self.init_from:
            raise ValueError("TrainConfig.init_weights and init_from are exclusive: choose one start")
        self._check_model()

    def _check_model(self) -> None:
        if self.config not in MAR_CONFIGS:
            raise ValueError(f"TrainConfig.config must be one of {sorted(MAR_CONFIGS)}, got {self.config!r}")
        mc = self.model_config()
        if mc.vae_stride != 1 or mc.token_channels != 3:
            raise ValueError(
                f"TrainConfig.config {self.config!r} is not a pixel-token MAR (needs vae_stride=1, token_channels=3)"
            )
        if mc.class_num < NUM_CLASSES:
            raise ValueError(
                f"TrainConfig.config {self.config!r} has {mc.class_num} classes; the data has {NUM_CLASSES}"
            )

    def model_config(self) -> MARConfig:
        try:
            return mar_config(self.config, **self.model_overrides)
        except TypeError as exc:  # dataclasses.replace with an unknown field
            raise ValueError(f"TrainConfig.model_overrides: {exc}") from exc

    @property
    def paths(self) -> dict[str, Path]:
        return {kind: Path(self.out + suffix) for kind, suffix in OUTPUT_SUFFIXES.items()}


def _check_int(name: str, value, lo: int) -> None:
    check_int(f"TrainConfig.{name}", value, lo)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate of the update from ``step`` to ``step + 1`` steps done: linear warm-up, then the schedule."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.lr_schedule == "constant":
        left = cfg.steps - step  # updates left, this one included
        return cfg.lr if left > cfg.cooldown_steps else cfg.lr * left / (cfg.cooldown_steps + 1)
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps))
    return 0.5 * cfg.lr * (1.0 + math.cos(math.pi * progress))


def shape_token_weight(cover: Tensor, flip: Tensor | None, patch: int, shape_weight: float) -> Tensor | None:
    """(B, N) loss weights 1 + (shape_weight - 1) x the share of each token's pixels the shape covers, from the
    images' coverage maps (B, H, W) uint8 (flipped where ``flip``, as the images were); None at weight 1."""
    if shape_weight == 1.0:
        return None
    cover = cover.float() / 255.0
    if flip is not None:
        cover = torch.where(flip[:, None, None], cover.flip(-1), cover)
    share = patchify(cover[:, None], patch).mean(-1)  # (B, N)
    return 1.0 + (shape_weight - 1.0) * share


def ema_decay_at(step: int, decay: float) -> float:
    """EMA decay with a warm-up, so checkpoints of short or young runs are not dominated by the init."""
    return min(decay, (1.0 + step) / (10.0 + step))


@torch.no_grad()
def update_ema(ema: nn.Module, model: nn.Module, decay: float) -> None:
    for e, p in zip(ema.parameters(), model.parameters(), strict=True):
        e.lerp_(p, 1.0 - decay)


def param_groups(model: nn.Module, weight_decay: float, lr_mults: dict[str, float] | None = None) -> list[dict]:
    """No weight decay on biases and norm scales (1-d tensors), as in MAR (timm's add_weight_decay).

    ``lr_mults`` maps a top-level submodule's name to a multiplier of the schedule's LR (the groups carry
    it as ``lr_mult``); the rest of the model trains at the schedule's LR."""
    lr_mults = lr_mults or {}
    unknown = sorted(set(lr_mults) - {name for name, _ in model.named_children()})
    if unknown:
        raise ValueError(f"lr_mults names {unknown}, which are not submodules of the model")
    groups: list[dict] = []
    for mult in dict.fromkeys([1.0, *lr_mults.values()]):
        names = [n for n, _ in model.named_children() if lr_mults.get(n, 1.0) == mult]
        params = [p for n, p in model.named_parameters() if lr_mults.get(n.split(".")[0], 1.0) == mult]
        if mult != 1.0 and not names:
            continue
        for ndim_ok, wd in ((lambda d: d <= 1, 0.0), (lambda d: d > 1, weight_decay)):
            groups.append({"params": [p for p in params if ndim_ok(p.ndim)], "weight_decay": wd, "lr_mult": mult})
    return groups


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def setup_distributed(device: str) -> tuple[Dist, torch.device]:
    """Join the torchrun process group when launched by torchrun (nccl on CUDA, gloo on CPU)."""
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(dev)
    if world > 1:
        dist.init_process_group("nccl" if use_cuda else "gloo")
    return Dist(rank, world), dev


def load_teacher(path: str | Path, student: MAR, device: torch.device) -> MAR:
    """The frozen distillation teacher; it must share the student's tokens, classes and head schedule."""
    teacher = load_model(path, device).requires_grad_(False)
    try:
        check_pair(teacher, student)  # the student plays the draft, the teacher the target
    except ValueError as exc:
        raise ValueError(f"distill_from {path}: {exc}") from exc
    if teacher.head.train_steps != student.head.train_steps:
        raise ValueError(
            f"distill_from {path}: head diffusion steps are {teacher.head.train_steps}, the student's are "
            f"{student.head.train_steps}"
        )
    return teacher


class Trainer(RunFiles):
    """Model, EMA, optimizer, data and generators of one process, and its training loop; save and resume
    are :class:`~csd.training.run_files.RunFiles`'."""

    def __init__(self, cfg: TrainConfig, dist_info: Dist | None = None, device: torch.device | str = "cpu"):
        self.cfg, self.dist = cfg, dist_info or Dist()
        self.device = torch.device(device)
        self.model_config = cfg.model_config()
        rank = self.dist.rank

        self.parent: dict | None = None  # what init_from / init_weights started from
        with drawing_from(torch.Generator().manual_seed(stream_seed(cfg.seed, "train/init"))):  # same on every rank
            self.model = self.build_model().to(self.device).train()
        self.ema = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.net = DistributedDataParallel(self.model) if self.dist.world > 1 else self.model
        self.optimizer = torch.optim.AdamW(self._param_groups(), lr=cfg.lr, betas=BETAS)

        # Dropout (if a config has it) draws from the global generator: seed it per rank and save it too.
        torch.manual_seed(stream_seed(cfg.seed, f"train/global/rank{rank}"))
        self.data_gen = torch.Generator().manual_seed(stream_seed(cfg.seed, f"train/data/rank{rank}"))
        self.model_gen = torch.Generator(self.device).manual_seed(stream_seed(cfg.seed, f"train/model/rank{rank}"))

        patch, size = self.pixel_layout()
        self.tokenizer = PixelTokenizer(patch_size=patch)
        data = make_dataset(cfg.data_size, cfg.data_seed, ShapesConfig(image_size=size))
        self.images, self.labels = data.images.to(self.device), data.labels.to(self.device)
        self.captions, self.coverage = data.captions, data.coverage.to(self.device)

        self.teacher = None
        if cfg.distill_from is not None:
            with torch.random.fork_rng(devices=[]):  # building it (a text model's LLM) must not move the global draws
                self.teacher = self.load_teacher(cfg.distill_from)
        # The teacher's path may not outlive the run (a copy, a renamed stage): its content hash names it for good.
        self.teacher_digest = None if cfg.distill_from is None else file_digest(weights_path(cfg.distill_from))

        self.step, self.elapsed, self.loss = 0, 0.0, math.nan
        if self.dist.main:
            self.cfg.paths["log"].parent.mkdir(parents=True, exist_ok=True)

    def build_model(self) -> nn.Module:
        model = MAR(self.model_config)
        if self.cfg.init_weights:
            self.load_shipped(model, self.cfg.init_weights)
        return model

    def load_teacher(self, path: str) -> nn.Module:
        """The frozen distillation teacher of ``--distill-from`` (:func:`load_teacher`)."""
        return load_teacher(path, self.model, self.device)

    def lr_mults(self) -> dict[str, float]:
        """Per-submodule LR multipliers (:func:`param_groups`); none by default."""
        return {}

    def _param_groups(self) -> list[dict]:
        return param_groups(self.model, self.cfg.weight_decay, self.lr_mults())

    def pixel_layout(self) -> tuple[int, int]:
        """(patch size, image size) of the pixel tokens the model is trained on."""
        return self.model_config.patch_size, self.model_config.img_size

    # --- one step ------------------------------------------------------------------------------

    def conditions(self, idx: Tensor):
        """The conditions of the images ``idx``: their class labels."""
        return self.labels[idx.to(self.device)]

    def objective(self, tokens: Tensor, conditions) -> Tensor:
        return self.net(tokens, conditions, self.model_gen, self.teacher, self.cfg.distill_weight)

    def draw(self) -> tuple[Tensor, Tensor, Tensor | None]:
        """A batch drawn with replacement: indices (B,), images (B, 3, H, W) and, with ``hflip``, which of
        them are flipped (B,) bool (None without)."""
        idx = torch.randint(0, len(self.labels), (self.cfg.batch_size,), generator=self.data_gen)
        images, flip = self.images[idx.to(self.device)], None
        if self.cfg.hflip:
            flip = (torch.rand(self.cfg.batch_size, generator=self.data_gen) < 0.5).to(self.device)
            images = torch.where(flip[:, None, None, None], images.flip(-1), images)
        return idx, images, flip

    def batch(self) -> tuple[Tensor, object]:
        """Tokens (B, N, d) and conditions of a batch (:meth:`draw`)."""
        idx, images, _ = self.draw()
        return self.tokenizer.encode(images), self.conditions(idx)

    def train_step(self) -> float:
        lr = lr_at(self.step, self.cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_mult", 1.0)
        tokens, conditions = self.batch()
        dtype = PRECISIONS[self.cfg.precision]
        with torch.autocast(self.device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = self.objective(tokens, conditions).float()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.cfg.grad_clip > 0:
            nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        update_ema(self.ema, self.model, ema_decay_at(self.step, self.cfg.ema_decay))
        self.step += 1
        value = loss.item()
        if not math.isfinite(value):
            raise FloatingPointError(f"training loss is {value} at step {self.step}")
        return value

    def fit(self) -> None:
        """Train up to ``cfg.steps`` steps (or ``cfg.max_minutes`` of total wall time), logging and saving as
        configured; always saves at the end."""
        cfg, start, t0 = self.cfg, self.step, time.perf_counter()
        elapsed0, window = self.elapsed, []
        done = self.step >= cfg.steps or self._out_of_time()
        while not done:
            window.append(self.train_step())
            self.elapsed = elapsed0 + time.perf_counter() - t0
            done = self.step >= cfg.steps or self._out_of_time()
            if self.step % cfg.log_every == 0 or done:
                self.loss = self._mean_over_ranks(sum(window) / len(window))
                window = []
                self._log(start, time.perf_counter() - t0)
            if cfg.save_every and self.step % cfg.save_every == 0 and not done:
                self.save()
        self.save()

    def _out_of_time(self) -> bool:
        """Whether the time budget is spent; rank 0 decides for all, so every rank stops at the same step."""
        if self.cfg.max_minutes is None:
            return False
        over = torch.tensor([float(self.elapsed >= 60.0 * self.cfg.max_minutes)], device=self.device)
        if self.dist.world > 1:
            dist.broadcast(over, 0)
        return bool(over.item())

    def _mean_over_ranks(self, value: float) -> float:
        if self.dist.world == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.item() / self.dist.world

    def _log(self, start: int, seconds: float) -> None:
        if not self.dist.main:
            return
        lr = lr_at(self.step - 1, self.cfg)
        record = {"step": self.step, "loss": self.loss, "lr": lr, "elapsed": round(self.elapsed, 2)}
        with self.cfg.paths["log"].open("a") as f:
            f.write(json.dumps(record) + "\n")
        rate = (self.step - start) / max(seconds, 1e-9)
        print(
            f"[{self.cfg.config}] step {self.step}/{self.cfg.steps} loss {self.loss:.4f} lr {lr:.2e} "
            f"{self.elapsed:.0f}s ({rate:.2f} steps/s)",
            flush=True,
        )


def train(cfg: TrainConfig, trainer_class: type[Trainer] = Trainer) -> Trainer:
    """Run (or, with ``cfg.resume``, continue) a training run; rank 0 writes the files."""
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    dist_info, device = setup_distributed(cfg.device)
    trainer = None
    try:
        trainer = trainer_class(cfg, dist_info, device)
        if cfg.resume:
            trainer.load(cfg.paths["state"])
        elif cfg.init_from:
            trainer.init_from(cfg.init_from)
        trainer.fit()
        if dist_info.world > 1:
            dist.barrier()  # rank 0 may still be writing files; gloo aborts if a peer tears down first
    finally:
        if dist_info.world > 1:
            if trainer is not None:  # DDP's reducer holds the process group: kept, gloo's threads would end only
                trainer.net = trainer.model  # as the interpreter does, which can abort a rank at exit
            dist.destroy_process_group()
    return trainer


def build_parser(prog: str, description: str, configs: Sequence[str]) -> argparse.ArgumentParser:
    d = TrainConfig.__dataclass_fields__
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--config", required=True, choices=sorted(configs), help="named model config")
    p.add_argument("--out", required=True, help="output path without suffix, e.g. assets/models/shapes_target")
    int_args = ("steps", "batch_size", "warmup_steps", "cooldown_steps", "data_size", "data_seed", "seed")
    for name in (*int_args, "log_every", "save_every"):
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=d[name].default)
    for name in ("lr", "weight_decay", "grad_clip", "ema_decay"):
        p.add_argument(f"--{name.replace('_', '-')}", type=float, default=d[name].default)
    p.add_argument("--lr-schedule", choices=LR_SCHEDULES, default=d["lr_schedule"].default)
    p.add_argument(
        "--hflip", action="store_true", help="random horizontal flips (the shapes are mirror-symmetric in distribution)"
    )
    p.add_argument("--model-overrides", type=json.loads, default={}, help="JSON, e.g. '{\"encoder_depth\": 1}'")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads per process")
    p.add_argument("--max-minutes", type=float, default=None, help="stop and save once the run's wall time is spent")
    p.add_argument("--device", choices=DEVICES, default="auto")
    p.add_argument(
        "--precision", choices=tuple(PRECISIONS), default="float32", help="bfloat16: autocast forward (1.6x on CPU)"
    )
    p.add_argument("--resume", action="store_true", help="continue from <out>.train_state.pt")
    p.add_argument(
        "--init-from",
        default=None,
        help="start from another run's .train_state.pt (weights, EMA, AdamW moments) with a new schedule",
    )
    p.add_argument(
        "--init-weights",
        default=None,
        help="start from a shipped model (.safetensors): its weights, fresh AdamW moments and schedule",
    )
    p.add_argument(
        "--distill-from",
        default=None,
        help="a frozen teacher model (.safetensors): also match its head's eps and log-variance",
    )
    p.add_argument("--distill-weight", type=float, default=d["distill_weight"].default)
    return p


def parse_args(argv: Sequence[str] | None = None) -> TrainConfig:
    p = build_parser("python -m csd.training.trainer", __doc__.split("\n")[0], MAR_CONFIGS)
    return TrainConfig(**vars(p.parse_args(argv)))


def run(cfg: TrainConfig, trainer_class: type[Trainer] = Trainer) -> Trainer:
    """:func:`train`, then say what was saved (the command-line entry of every trainer)."""
    trainer = train(cfg, trainer_class)
    if trainer.dist.main:
        print(f"saved {trainer.cfg.paths['weights']} ({trainer.step} steps, {trainer.elapsed:.0f}s)", flush=True)
    return trainer


def main(argv: Sequence[str] | None = None) -> None:
    run(parse_args(argv))


if __name__ == "__main__":
    main()
