"""Continuous speculative decoding with block verification (DESIGN.md section 2).

pre-fill (target alone) -> repeat { draft gamma AR steps -> one target backbone pass over the
context before the block -> target head chains (shared noise when aligned) -> accept or resample
every drafted token -> commit the block }.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from csd.acceptance import CRITERIA, TRAJECTORY_TERMS, Verdict, accept, aligned_verdict, exact_verdict, path_log_ratio
from csd.chain import ChainNoise, GaussianChain, HeadCondition, Trajectory, evaluate_path, run_chain
from csd.resample import Resampled, resample_gaussian, resample_paths
from csd.rng import ImageStreams, check_seeds
from csd.sampling import (
    ARModel,
    Generation,
    PhaseTimer,
    SamplingConfig,
    StepCallback,
    backbone_conditions,
    check_labels,
    commit,
    draw_chain_noise,
    make_plan,
    model_device,
    predict_step,
    put,
    step_condition,
)
from csd.trace import Maker, Trace


@dataclass(frozen=True)
class CSDConfig:
    """Knobs of the speculative decoder.

    gamma: draft length in AR steps per block. gamma_schedule: optional draft lengths of the first
    blocks, in order (block b drafts gamma_schedule[b] steps; the blocks after them draft gamma);
    empty by default, the paper's constant draft length. prefill: fraction of tokens the target makes
    before drafting starts. align: share the draft's noise with the target's chain.
    criterion: "aligned" (the paper's approximation) or "exact" (path-space reference).
    trajectory_term: sign convention of criterion (a)'s trajectory term ("derived", "published")
    or "none" (final-step term only). tau_v: widening of the final Gaussians in the test.
    resample_widening: widening of the same Gaussians when resampling (the published code: 1).
    max_tries: resampler cap. counterfactual: also run the target chain with the other noise
    choice, to record the draft-target distance with and without alignment.
    """

    gamma: int = 8
    gamma_schedule: tuple[int, ...] = ()
    prefill: float = 0.05
    align: bool = True
    criterion: str = "aligned"
    trajectory_term: str = "derived"
    tau_v: float = 42.0
    resample_widening: float = 1.0
    max_tries: int = 100
    counterfactual: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.gamma, bool) or not isinstance(self.gamma, int) or self.gamma < 1:
            raise ValueError(f"gamma (draft length) must be an int >= 1, got {self.gamma!r}")
        sched = self.gamma_schedule
        bad = lambda g: isinstance(g, bool) or not isinstance(g, int) or g < 1  # noqa: E731
        if not isinstance(sched, tuple | list) or any(bad(g) for g in sched):
            raise ValueError(
                f"gamma_schedule (draft lengths of the first blocks) must be a sequence of ints >= 1, got {sched!r}"
            )
        object.__setattr__(self, "gamma_schedule", tuple(sched))
        if not (isinstance(self.prefill, int | float) and 0.0 <= self.prefill < 1.0):
            raise ValueError(f"prefill ratio must be in [0, 1), got {self.prefill!r}")
        if self.criterion not in CRITERIA:
            raise ValueError(f"criterion must be one of {CRITERIA}, got {self.criterion!r}")
        if self.trajectory_term not in TRAJECTORY_TERMS:
            raise ValueError(f"trajectory_term must be one of {TRAJECTORY_TERMS}, got {self.trajectory_term!r}")
        for name in ("tau_v", "resample_widening"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and 1.0 <= v <= 1e4):
                raise ValueError(f"{name} must be in [1, 10000], got {v!r}")
        if isinstance(self.max_tries, bool) or not isinstance(self.max_tries, int) or not 1 <= self.max_tries <= 10000:
            raise ValueError(f"max_tries (resampler cap) must be an int in [1, 10000], got {self.max_tries!r}")

    def block_length(self, block: int) -> int:
        """AR steps drafted in block ``block`` (0-based): the schedule's entry, else gamma."""
        return self.gamma_schedule[block] if block < len(self.gamma_schedule) else self.gamma


def check_pair(target: ARModel, draft: ARModel) -> None:
    """Draft and target must share the tokenizer and token layout."""
    for attr, what in (("seq_len", "number of tokens"), ("token_dim", "token width"), ("num_classes", "classes")):
        if getattr(target, attr) != getattr(draft, attr):
            raise ValueError(
                f"draft model does not match the target's token layout: {what} ({attr}) is "
                f"{getattr(draft, attr)} for the draft and {getattr(target, attr)} for the target"
            )


def _cat_rows(parts: list[Tensor], batch: int, dim: int = 0) -> Tensor:
    """Concatenate per-step row tensors (image-major within each step) into image-major block rows."""
    split = [p.reshape(*p.shape[:dim], batch, -1, *p.shape[dim + 1 :]) for p in parts]
    joined = torch.cat(split, dim=dim + 1)
    return joined.reshape(*joined.shape[:dim], -1, *joined.shape[dim + 2 :])


def _cat_trajectories(trajs: list[Trajectory], batch: int) -> Trajectory:
    return Trajectory(
        x=_cat_rows([t.x for t in trajs], batch),
        states=_cat_rows([t.states for t in trajs], batch, dim=1),
        mean=_cat_rows([t.mean for t in trajs], batch, dim=1),
        std=_cat_rows([t.std for t in trajs], batch, dim=1),
    )


def _cat_conditions(conds: list[HeadCondition], batch: int) -> HeadCondition:
    pick = lambda name: (
        None
        if getattr(conds[0], name) is None
        else _cat_rows(  # noqa: E731
            [getattr(c, name) for c in conds], batch
        )
    )
    return HeadCondition(pick("z"), pick("z_uncond"), pick("cfg"))


def _rows_per_image(rows: Tensor, per_image: int, batch: int) -> Tensor:
    """How many of the given block rows (flat, image-major indices) belong to each image."""
    return torch.bincount(rows // per_image, minlength=batch)


class _Block:
    """Draft-and-verify state of one block; kept small so each phase reads as a method."""

    def __init__(self, trajectory: Trajectory, noise: ChainNoise, cond_q: HeadCondition, pos: Tensor):
        self.draft, self.noise, self.cond_q, self.pos = trajectory, noise, cond_q, pos


@torch.inference_mode()
def speculative_generate(
    target: ARModel,
    draft: ARModel,
    labels: Sequence[int] | Tensor,
    seeds: Sequence[int],
    sampling: SamplingConfig | None = None,
    csd: CSDConfig | None = None,
    on_step: StepCallback | None = None,
) -> Generation:
    """Generate with continuous speculative decoding; same orders and chain noise as :func:`generate`.

    ``on_step(done, total, phase)`` is called after each pre-fill step ("pre-fill"), each drafted
    step ("draft") and each block's verification ("verify", ``done`` = the block's last step + 1)."""
    report = on_step or (lambda done, total, phase: None)
    sampling, csd = sampling or SamplingConfig(), csd or CSDConfig()
    check_pair(target, draft)
    seeds = check_seeds(seeds)
    device = model_device(target)
    if model_device(draft) != device:
        raise ValueError(f"draft model is on {model_device(draft)}, the target on {device}: use one device")
    batch, n, d = len(seeds), target.seq_len, target.token_dim
    labels = check_labels(labels, target.num_classes, batch, device)
    if sampling.num_steps > n:
        raise ValueError(f"num_steps (AR steps) must be in [1, {n}] (the number of tokens), got {sampling.num_steps}")
    # Alignment shares every noise tensor, so both heads run the same number of transitions.
    head_steps = sampling.head_steps or target.head.chain().num_steps()
    chain_p, chain_q = target.head.chain(head_steps), draft.head.chain(head_steps)
    plan = make_plan(seeds, n, sampling, device)
    streams = {name: ImageStreams(seeds, name, device) for name in ("chain", "accept", "resample", "independent")}
    timer = PhaseTimer(device)
    trace = Trace.empty(batch, n, plan.sizes, {"sampling": asdict(sampling), "csd": asdict(csd)})
    tokens = torch.zeros(batch, n, d, device=device)
    mask = torch.ones(batch, n, dtype=torch.bool, device=device)

    # 1. Pre-fill: the target alone until a fraction rho of the tokens exists.
    s, made = 0, 0
    while s < plan.num_steps and made < csd.prefill * n:
        pos = plan.positions(s)
        noise = draw_chain_noise(streams["chain"], plan.sizes[s], head_steps, d)
        traj, _ = predict_step(
            target, chain_p, tokens, mask, labels, pos, plan.cfg[s], noise, sampling, timer, "prefill"
        )
        commit(tokens, mask, pos, traj.x)
        put(trace.maker, pos, int(Maker.PREFILL))
        put(trace.ar_step, pos, s)
        trace.target_passes += 1
        made += plan.sizes[s]
        s += 1
        report(s, plan.num_steps, "pre-fill")

    block_id = 0
    while s < plan.num_steps:
        steps = range(s, min(s + csd.block_length(block_id), plan.num_steps))
        # 2. Draft the block's AR steps (gamma or the schedule's entry), feeding back the draft's own tokens.
        d_tokens, d_mask = tokens.clone(), mask.clone()
        trajs, noises, conds, poss = [], [], [], []
        for j in steps:
            pos = plan.positions(j)
            noise = draw_chain_noise(streams["chain"], plan.sizes[j], head_steps, d)
            traj, cond = predict_step(
                draft, chain_q, d_tokens, d_mask, labels, pos, plan.cfg[j], noise, sampling, timer, "draft"
            )
            commit(d_tokens, d_mask, pos, traj.x)
            trajs.append(traj)
            noises.append(noise)
            conds.append(cond)
            poss.append(pos)
            put(trace.ar_step, pos, j)
            trace.draft_passes += 1
            report(j + 1, plan.num_steps, "draft")
        blk = _Block(
            _cat_trajectories(trajs, batch),
            ChainNoise(_cat_rows([z.xi for z in noises], batch), _cat_rows([z.eps for z in noises], batch, dim=1)),
            _cat_conditions(conds, batch),
            torch.cat(poss, dim=1),
        )
        per_image = blk.pos.shape[1]

        # 3. Verify: one target pass over the context before the block, then the target's chains.
        with timer("target_backbone"):
            z_p, zu_p = backbone_conditions(target, tokens, mask, labels, sampling)
        trace.target_passes += 1
        cond_p = step_condition(z_p, zu_p, blk.pos, blk.cond_q.cfg if blk.cond_q.cfg is not None else None)
        with timer("target_head"):
            own_noise = blk.noise if csd.align else draw_chain_noise(streams["independent"], per_image, head_steps, d)
            traj_p = run_chain(chain_p, cond_p, own_noise, sampling.temperature)
        distance = (blk.draft.x - traj_p.x).norm(dim=-1)
        put(trace.distance_aligned if csd.align else trace.distance_independent, blk.pos, distance)
        if csd.counterfactual:
            with timer("counterfactual"):
                other = draw_chain_noise(streams["independent"], per_image, head_steps, d) if csd.align else blk.noise
                x_other = run_chain(chain_p, cond_p, other, sampling.temperature).x
            put(
                trace.distance_independent if csd.align else trace.distance_aligned,
                blk.pos,
                (blk.draft.x - x_other).norm(dim=-1),
            )

        # 4. Accept or resample every drafted token.
        with timer("verify"):
            if csd.criterion == "aligned":
                verdict = aligned_verdict(blk.draft, traj_p, csd.tau_v, csd.trajectory_term)
                x_accepted = blk.draft.x
            else:
                mean_p, std_p = evaluate_path(chain_p, cond_p, blk.draft.states, sampling.temperature)
                verdict = exact_verdict(blk.draft, mean_p, std_p)
                x_accepted = mean_p[-1]
            accepted = accept(verdict, streams["accept"].rand(per_image).reshape(-1))
        with timer("resample"):
            x = x_accepted.clone()
            rejected = (~accepted).nonzero().squeeze(-1)
            res = None
            if rejected.numel():
                res = _resample(
                    csd,
                    sampling,
                    blk,
                    verdict,
                    traj_p,
                    cond_p,
                    chain_p,
                    chain_q,
                    rejected,
                    per_image,
                    batch,
                    streams["resample"],
                )
                x[rejected] = res.x
        commit(tokens, mask, blk.pos, x)
        _record_block(trace, blk.pos, block_id, verdict, accepted, rejected, res)
        s = steps.stop
        block_id += 1
        report(s, plan.num_steps, "verify")

    trace.times = dict(timer.times)
    return Generation(tokens.float().cpu(), trace)


def _resample(
    csd: CSDConfig,
    sampling: SamplingConfig,
    blk: _Block,
    verdict: Verdict,
    traj_p: Trajectory,
    cond_p: HeadCondition,
    chain_p: GaussianChain,
    chain_q: GaussianChain,
    rejected: Tensor,
    per_image: int,
    batch: int,
    stream: ImageStreams,
) -> Resampled:
    """Draw the rejected tokens from max(0, p - q) / Z; a capped token takes the target's own sample."""
    owner = lambda pending: _rows_per_image(rejected[pending], per_image, batch)  # noqa: E731
    fallback = traj_p.x[rejected]
    if csd.criterion == "aligned":
        w = csd.resample_widening
        d = traj_p.x.shape[-1]

        def draws(k: int, pending: Tensor) -> tuple[Tensor, Tensor]:
            counts = owner(pending)
            return stream.randn_rows(counts, k, d), stream.rand_rows(counts, k)

        return resample_gaussian(
            p_mean=traj_p.final_mean[rejected],
            p_std=w * traj_p.final_std[rejected],
            q_mean=blk.draft.final_mean[rejected],
            q_std=w * blk.draft.final_std[rejected],
            draws=draws,
            fallback=fallback,
            max_tries=csd.max_tries,
            log_weight=-verdict.trajectory[rejected],
        )

    cond_p_rej, cond_q_rej = cond_p.select(rejected), blk.cond_q.select(rejected)
    steps, d = chain_p.num_steps(), traj_p.x.shape[-1]

    def propose(pending: Tensor) -> tuple[Tensor, Tensor]:
        raw = stream.randn_rows(owner(pending), steps, d)  # (m, T, d)
        noise = ChainNoise(raw[:, 0], raw[:, 1:].transpose(0, 1))
        path = run_chain(chain_p, cond_p_rej.select(pending), noise, sampling.temperature)
        mean_q, std_q = evaluate_path(chain_q, cond_q_rej.select(pending), path.states, sampling.temperature)
        return path.x, path_log_ratio(path.states, mean_q, std_q, path.mean, path.std)

    return resample_paths(propose, lambda pending: stream.rand_rows(owner(pending)), fallback, csd.max_tries)


def _record_block(
    trace: Trace,
    pos: Tensor,
    block_id: int,
    verdict: Verdict,
    accepted: Tensor,
    rejected: Tensor,
    res: Resampled | None,
) -> None:
    maker = torch.full_like(accepted, int(Maker.ACCEPTED), dtype=torch.int8)
    tries = torch.zeros_like(accepted, dtype=torch.int32)
    if res is not None:
        maker[rejected] = torch.where(res.capped, int(Maker.CAPPED), int(Maker.RESAMPLED)).to(torch.int8)
        tries[rejected] = res.tries.to(torch.int32)
    put(trace.maker, pos, maker)
    put(trace.block, pos, block_id)
    put(trace.accept_prob, pos, verdict.accept_prob)
    put(trace.log_ratio_trajectory, pos, verdict.trajectory)
    put(trace.log_ratio_final, pos, verdict.final)
    put(trace.resample_tries, pos, tries)
