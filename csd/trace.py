"""The trace of a generation run: plain arrays that the figure builders consume (DESIGN.md section 7)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np
import torch
from torch import Tensor


def _numpy(t: Tensor) -> np.ndarray:
    """A tensor as numpy: float64 kept (a float64 run's trace), other floats as float32."""
    t = t.detach()
    return (t if t.dtype == torch.float64 or not t.is_floating_point() else t.float()).cpu().numpy()


def _put(arr: np.ndarray, pos: Tensor, values, pending: list | None = None) -> None:
    """arr[b, pos[b, j]] = values[b, j] for a (B, N) array; values (B*k,), (B, k) or a scalar. With a
    ``pending`` list the write is kept there, tensors where they are, for :meth:`Trace.flush` to make."""
    if pending is not None:
        pending.append((arr, pos, values))
        return
    p = pos.cpu().numpy()
    if isinstance(values, Tensor):
        values = _numpy(values).reshape(p.shape)
    arr[np.arange(p.shape[0])[:, None], p] = values


class Maker(IntEnum):
    """Who produced a token."""

    PREFILL = 0  # the target, before drafting starts
    ACCEPTED = 1  # the draft, accepted by the target
    RESAMPLED = 2  # drawn from the modified distribution after a rejection
    CAPPED = 3  # the resampler hit its try cap; the target's own aligned sample was taken
    TARGET = 4  # target-only generation
    DRAFT = 5  # draft-only generation
    ZEROED = 6  # the resampler hit its try cap and the token was left at zero (the published code's fallback)
    NEXT = 7  # the target, after a wholly accepted block, from the verification's pass (a causal family's)


@dataclass
class TokenDetails:
    """What a speculative run decided each token from, kept only when asked (``keep_details``): per
    token (B, N, ...) by grid position, NaN where it does not apply. About 2 T d floats per token
    (T transitions, d values): kept for the images a person inspects, not for benchmarks.

    draft_tokens: the draft's proposal x^q; target_tokens: the target's own sample x^p (its chain on
    the shared noise when aligned; for pre-filled tokens, the token itself); accept_draw: the
    uniform u a drafted token was accepted with (u < min(1, r)); draft_mean/std and
    target_mean/std (B, N, T, d): every transition of both chains for the token."""

    draft_tokens: np.ndarray
    target_tokens: np.ndarray
    accept_draw: np.ndarray
    draft_mean: np.ndarray
    draft_std: np.ndarray
    target_mean: np.ndarray
    target_std: np.ndarray

    @classmethod
    def empty(cls, batch: int, num_tokens: int, steps: int, dim: int, dtype=np.float32) -> TokenDetails:
        full = lambda *shape: np.full((batch, num_tokens, *shape), np.nan, dtype=dtype)
        return cls(full(dim), full(dim), full(), full(steps, dim), full(steps, dim), full(steps, dim), full(steps, dim))


@dataclass(frozen=True)
class BlockRecord:
    """What the trace keeps of a verified block: its index, AR steps and the tokens per image of each
    (``sizes``), the positions (B, k) of all its drafted tokens and the AR steps it kept (``kept``); per
    committed row (the first ``sum(sizes[:kept])`` rows of each image, image-major) who made it (a
    :class:`Maker`), min(1, r), both terms of log r and the resampler's tries; per drafted row the acceptance
    draw and, under acceptance_unit "token", the fraction of its tokens accepted (else None)."""

    index: int
    steps: range
    sizes: list[int]
    pos: Tensor
    kept: int
    maker: Tensor
    accept_prob: Tensor
    log_ratio_trajectory: Tensor
    log_ratio_final: Tensor
    resample_tries: Tensor
    draws: Tensor
    unit_accepted: Tensor | None


class TraceStatistics:
    """What tables, figures and the app read of a :class:`Trace`: counts per maker, acceptance rates, per-step
    reductions and the scalars of :meth:`summary`."""

    maker: np.ndarray
    ar_step: np.ndarray
    accept_prob: np.ndarray
    resample_tries: np.ndarray
    distance_aligned: np.ndarray
    distance_independent: np.ndarray
    step_sizes: list[int]
    target_passes: int
    draft_passes: int
    times: dict[str, float]
    unit_accepted: np.ndarray | None
    block_steps: list[tuple[int, int]]

    @property
    def batch(self) -> int:
        return int(self.maker.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.maker.shape[1])

    def count(self, maker: Maker) -> int:
        return int((self.maker == maker).sum())

    @property
    def verified(self) -> np.ndarray:
        """(B, N) bool: tokens that went through verification."""
        return np.isin(self.maker, [Maker.ACCEPTED, Maker.RESAMPLED, Maker.CAPPED, Maker.ZEROED])

    @property
    def acceptance_rate(self) -> float:
        """Fraction of verified (drafted) tokens that were accepted; NaN when nothing was drafted."""
        n = int(self.verified.sum())
        return float("nan") if n == 0 else self.count(Maker.ACCEPTED) / n

    @property
    def mean_accept_prob(self) -> float:
        v = self.accept_prob[self.verified]
        return float("nan") if v.size == 0 else float(v.mean())

    def per_step(self, values: np.ndarray, reduce=np.nanmean) -> np.ndarray:
        """Reduce a (B, N) per-token array to (B, S) per image and AR step (NaN where empty)."""
        out = np.full((self.batch, len(self.step_sizes)), np.nan, dtype=np.float64)
        for s in range(len(self.step_sizes)):
            sel = self.ar_step == s
            for b in range(self.batch):
                vals = values[b][sel[b]]
                vals = vals[~np.isnan(vals)] if vals.dtype.kind == "f" else vals
                if vals.size:
                    out[b, s] = reduce(vals)
        return out

    def acceptance_per_step(self) -> np.ndarray:
        """(B, S) fraction of verified tokens accepted at each AR step (NaN where none verified)."""
        acc = np.where(self.verified, (self.maker == Maker.ACCEPTED).astype(np.float32), np.nan)
        return self.per_step(acc)

    def summary(self) -> dict:
        """Scalars for tables and the app."""
        tries = self.resample_tries[self.resample_tries > 0]
        return {
            "tokens": self.batch * self.num_tokens,
            "prefill": self.count(Maker.PREFILL),
            "accepted": self.count(Maker.ACCEPTED),
            "resampled": self.count(Maker.RESAMPLED),
            "capped": self.count(Maker.CAPPED),
            "zeroed": self.count(Maker.ZEROED),
            "next": self.count(Maker.NEXT),
            "acceptance_rate": self.acceptance_rate,
            "unit_acceptance_rate": self.unit_acceptance_rate,
            "mean_accept_prob": self.mean_accept_prob,
            "mean_resample_tries": float(tries.mean()) if tries.size else float("nan"),
            "distance_aligned": float(np.nanmean(self.distance_aligned))
            if np.isfinite(self.distance_aligned).any()
            else float("nan"),
            "distance_independent": float(np.nanmean(self.distance_independent))
            if np.isfinite(self.distance_independent).any()
            else float("nan"),
            "target_passes": self.target_passes,
            "draft_passes": self.draft_passes,
            "steps_kept_per_block": self.steps_kept_per_block,
            "time_total": float(sum(self.times.values())),
        }

    @property
    def steps_kept_per_block(self) -> float:
        """Mean AR steps committed per drafted block; NaN when nothing was drafted."""
        return float(np.mean([k for k, _ in self.block_steps])) if self.block_steps else float("nan")

    @property
    def unit_acceptance_rate(self) -> float:
        """Fraction of the verified rows' tokens accepted (acceptance_unit "token"); NaN otherwise."""
        if self.unit_accepted is None or not self.verified.any():
            return float("nan")
        return float(np.nanmean(self.unit_accepted[self.verified]))


@dataclass
class Trace(TraceStatistics):
    """Per token (arrays of shape (B, N), indexed by grid position) and per run; read through
    :class:`TraceStatistics`.

    Float arrays hold NaN where a quantity does not apply (e.g. acceptance of pre-filled tokens); they are
    float32 (float64 for a run at precision "float64", :meth:`empty`'s ``dtype``).
    """

    maker: np.ndarray  # int8, a Maker value
    ar_step: np.ndarray  # int16, AR step that produced the token
    block: np.ndarray  # int16, draft block index, -1 outside blocks
    accept_prob: np.ndarray  # float, min(1, r)
    log_ratio_trajectory: np.ndarray  # float, trajectory term of log r
    log_ratio_final: np.ndarray  # float, final-step term of log r
    resample_tries: np.ndarray  # int32, proposals drawn by the resampler (0 if none)
    distance_aligned: np.ndarray  # float, ||x^q - x^p|| with shared noise
    distance_independent: np.ndarray  # float, ||x^q - x^p|| with independent noise
    step_sizes: list[int]
    # Target passes: one per AR step or verified block; a backbone pass (MAR, Harmon) or a whole flow chain
    # (xAR, whose backbone runs once per flow step). A CFG pass over a doubled batch counts once.
    target_passes: int = 0
    draft_passes: int = 0
    times: dict[str, float] = field(default_factory=dict)  # seconds per phase
    work: dict[str, dict[str, int]] = field(default_factory=dict)  # per phase: calls, steps, token_steps
    settings: dict = field(default_factory=dict)
    details: TokenDetails | None = None  # per-token inputs of every decision, when asked for
    # acceptance_unit "token": the fraction of each verified row's tokens accepted (an xAR cell's)
    unit_accepted: np.ndarray | None = None
    # Per block: (AR steps committed, AR steps drafted); they differ only under the exact block.
    block_steps: list[tuple[int, int]] = field(default_factory=list)
    # Writes not made yet (a deferred trace's: see :meth:`empty`), made by :meth:`flush`.
    pending: list | None = field(default=None, repr=False, compare=False)

    @classmethod
    def empty(
        cls,
        batch: int,
        num_tokens: int,
        step_sizes: list[int],
        settings: dict | None = None,
        dtype=np.float32,
        defer: bool = False,
    ) -> Trace:
        """An empty trace. ``defer``: per-token writes keep their tensors on the device until :meth:`flush`
        copies them all, when the run ends (a CUDA run's loop then never waits for the device)."""
        nan = lambda: np.full((batch, num_tokens), np.nan, dtype=dtype)
        return cls(
            pending=[] if defer else None,
            maker=np.full((batch, num_tokens), -1, dtype=np.int8),
            ar_step=np.full((batch, num_tokens), -1, dtype=np.int16),
            block=np.full((batch, num_tokens), -1, dtype=np.int16),
            accept_prob=nan(),
            log_ratio_trajectory=nan(),
            log_ratio_final=nan(),
            resample_tries=np.zeros((batch, num_tokens), dtype=np.int32),
            distance_aligned=nan(),
            distance_independent=nan(),
            step_sizes=list(step_sizes),
            settings=dict(settings or {}),
        )

    # --- writing (the samplers write the trace only through these) -----------------------------

    def flush(self) -> None:
        """Make every deferred write, in the order they were recorded (one wait for the device: the first copy)."""
        pending, self.pending = self.pending, None
        for arr, pos, values in pending or ():
            _put(arr, pos, values)

    def record_made(self, pos: Tensor, step: int, maker: Maker | None) -> None:
        """Tokens at ``pos`` (B, k) made at AR step ``step``; ``maker`` None: drafted, not yet decided."""
        _put(self.ar_step, pos, step, self.pending)
        if maker is not None:
            _put(self.maker, pos, int(maker), self.pending)

    def record_pass(self, model: str) -> None:
        """One pass of the "target" or the "draft": an AR step's or a verified block's (see ``target_passes``)."""
        if model == "target":
            self.target_passes += 1
        elif model == "draft":
            self.draft_passes += 1
        else:
            raise ValueError(f"model must be 'target' or 'draft', got {model!r}")

    def record_times(self, times: dict[str, float], work: dict[str, dict[str, int]] | None = None) -> None:
        """Seconds per phase of the whole run and, optionally, what each phase did (PhaseTimer.work)."""
        self.times = dict(times)
        self.work = {phase: dict(w) for phase, w in (work or {}).items()}

    def keep_details(self, steps: int, dim: int) -> None:
        """From now on keep :class:`TokenDetails` (chains of ``steps`` transitions, tokens of ``dim``)."""
        self.details = TokenDetails.empty(self.batch, self.num_tokens, steps, dim, self.accept_prob.dtype)

    def record_chain(self, pos: Tensor, model: str, traj) -> None:
        """A chain's token and transitions for the tokens at ``pos`` (B, k); ``traj`` a Trajectory with
        rows image-major. ``model``: "draft" or "target". No-op unless details are kept."""
        if self.details is None:
            return
        b, k = pos.shape
        p = pos.cpu().numpy()
        rows = np.arange(b)[:, None]
        per_token = lambda t: _numpy(t).reshape(b, k, *t.shape[1:])
        per_step = lambda t: np.moveaxis(_numpy(t).reshape(t.shape[0], b, k, -1), 0, 2)
        det = self.details
        tokens, mean, std = (
            (det.draft_tokens, det.draft_mean, det.draft_std)
            if model == "draft"
            else (det.target_tokens, det.target_mean, det.target_std)
        )
        steps = traj.mean.shape[0]  # <= the kept length: shorter chains leave NaN after their last step
        tokens[rows, p] = per_token(traj.x)
        mean[rows, p, :steps] = per_step(traj.mean)
        std[rows, p, :steps] = per_step(traj.std)

    def record_distance(self, pos: Tensor, distance: Tensor, aligned: bool) -> None:
        """||x^q - x^p|| of a block's tokens, with shared (``aligned``) or independent noise."""
        _put(self.distance_aligned if aligned else self.distance_independent, pos, distance, self.pending)

    def record_block(self, r: BlockRecord) -> None:
        """What verification decided for a block: the AR step of every drafted token, who made each committed
        one and the criterion's values for it, the acceptance draws and per-token acceptance of every drafted
        row, and how many of its AR steps the block kept."""
        for step, pos in zip(r.steps, r.pos.split(r.sizes, dim=1), strict=True):
            _put(self.ar_step, pos, step, self.pending)
        kept = r.pos[:, : sum(r.sizes[: r.kept])]
        for arr, values in (
            (self.maker, r.maker),
            (self.block, r.index),
            (self.accept_prob, r.accept_prob),
            (self.log_ratio_trajectory, r.log_ratio_trajectory),
            (self.log_ratio_final, r.log_ratio_final),
            (self.resample_tries, r.resample_tries),
        ):
            _put(arr, kept, values, self.pending)
        if self.details is not None:
            _put(self.details.accept_draw, r.pos, r.draws, self.pending)
        if r.unit_accepted is not None:
            if self.unit_accepted is None:
                self.unit_accepted = np.full(self.maker.shape, np.nan, dtype=self.accept_prob.dtype)
            _put(self.unit_accepted, r.pos, r.unit_accepted, self.pending)
        self.block_steps.append((r.kept, len(r.steps)))
