"""Continuous speculative decoding with block verification (DESIGN.md section 2).

pre-fill (target alone) -> repeat { draft gamma AR steps -> one target backbone pass over the
context before the block -> target head chains (shared noise when aligned) -> accept or resample
every drafted token -> commit the block }.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from csd.acceptance import CRITERIA, TRAJECTORY_TERMS, Verdict, accept, aligned_verdict, exact_verdict, path_log_ratio
from csd.chain import ChainNoise, Trajectory, cat_rows
from csd.checks import check_choice, check_int, check_ints, check_number
from csd.family import ModelFamily, Plan, TokenChain
from csd.resample import Resampled, resample_gaussian, resample_paths
from csd.rng import ImageStreams, check_seeds
from csd.sampling import (
    Generation,
    PhaseTimer,
    SamplingConfig,
    StepCallback,
    commit,
    draw_chain_noise,
    head_step_schedule,
    model_device,
    predict_step,
)
from csd.trace import Maker, Trace

ACCEPTANCE_UNITS = ("row", "token")


def split_rows(traj: Trajectory, units: int) -> Trajectory:
    """A trajectory of n rows of ``units`` tokens each as one of n * units rows (row-major)."""
    flat = lambda a: a.reshape(*a.shape[:-2], a.shape[-2] * units, a.shape[-1] // units)
    return Trajectory(x=flat(traj.x), states=flat(traj.states), mean=flat(traj.mean), std=flat(traj.std))


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
    choice, to record the draft-target distance with and without alignment. draft_head_steps: a
    cheaper (or dearer) draft head, None for the target's head steps; a different number of steps
    cannot share noise or compare per-step stds, so it needs align=False, criterion "aligned" and
    trajectory_term "none". With a head-step schedule (SamplingConfig.head_steps_min) every block
    runs the head steps of its first AR step. acceptance_unit: "row" (a token of MAR or Harmon, a
    whole cell of xAR: the exact unit) or "token" (a family whose rows hold several tokens, xAR's
    cells: each token of a cell tested and resampled alone, an approximation to measure; a cell
    counts as accepted when all of its tokens are, and Trace.unit_accepted holds the fraction).
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
    draft_head_steps: int | None = None
    acceptance_unit: str = "row"

    def __post_init__(self) -> None:
        check_int("gamma (draft length)", self.gamma, 1)
        schedule = check_ints("gamma_schedule (draft lengths of the first blocks)", self.gamma_schedule, 1)
        object.__setattr__(self, "gamma_schedule", schedule)
        check_number("prefill ratio", self.prefill, 0.0, 1.0, hi_open=True)
        check_choice("criterion", self.criterion, CRITERIA)
        check_choice("trajectory_term", self.trajectory_term, TRAJECTORY_TERMS)
        check_number("tau_v", self.tau_v, 1.0, 1e4)
        check_number("resample_widening", self.resample_widening, 1.0, 1e4)
        check_int("max_tries (resampler cap)", self.max_tries, 1, 10000)
        if self.draft_head_steps is not None:
            check_int("draft_head_steps", self.draft_head_steps, 1, 1000, word="None or an int")
        check_choice("acceptance_unit", self.acceptance_unit, ACCEPTANCE_UNITS)
        if self.acceptance_unit == "token" and self.criterion != "aligned":
            raise ValueError("acceptance_unit 'token' needs criterion 'aligned' (the exact test compares whole rows)")

    def block_length(self, block: int) -> int:
        """AR steps drafted in block ``block`` (0-based): the schedule's entry, else gamma."""
        return self.gamma_schedule[block] if block < len(self.gamma_schedule) else self.gamma


def check_pair(target: ModelFamily, draft: ModelFamily) -> None:
    """Draft and target must share the tokenizer and token layout."""
    for attr, what in (("seq_len", "number of tokens"), ("token_dim", "token width"), ("num_classes", "classes")):
        if getattr(target, attr, None) != getattr(draft, attr, None):
            raise ValueError(
                f"draft model does not match the target's token layout: {what} ({attr}) is "
                f"{getattr(draft, attr, None)} for the draft and {getattr(target, attr, None)} for the target"
            )


@torch.inference_mode()
def speculative_generate(
    target: ModelFamily,
    draft: ModelFamily,
    conditions: Sequence | Tensor,
    seeds: Sequence[int],
    sampling: SamplingConfig | None = None,
    csd: CSDConfig | None = None,
    on_step: StepCallback | None = None,
    keep_details: bool = False,
) -> Generation:
    """Generate with continuous speculative decoding; same orders and chain noise as :func:`generate`.

    ``on_step(done, total, phase)`` is called after each pre-fill step ("pre-fill"), each drafted
    step ("draft") and each block's verification ("verify", ``done`` = the block's last step + 1).
    ``keep_details``: the trace also keeps every token's draft proposal, target sample, acceptance
    draw and both chains' transitions (:class:`csd.trace.TokenDetails`), for inspection."""
    run = _Decoding.start(target, draft, conditions, seeds, sampling or SamplingConfig(), csd or CSDConfig(), on_step)
    if keep_details:
        run.trace.keep_details(max(run.steps_p + [run.csd.draft_head_steps or 0]), target.token_dim)
    s = run.prefill()  # 1. the target alone until a fraction rho of the tokens exists
    for block_id, steps in enumerate(run.blocks(s)):
        block = run.draft_block(steps)  # 2. gamma AR steps of the draft, on its own tokens
        check = run.verify(block)  # 3. one target pass over the context before the block
        decision = run.accept_or_resample(block, check)  # 4. min(1, r), else a draw from max(0, p - q)
        run.commit_block(block, block_id, decision)  # 5. the block's tokens join the context
    return run.finish()


@dataclass
class _Block:
    """A drafted block: its AR steps, positions (B, k) and the draft's trajectories, noise and chains
    (rows image-major over the block)."""

    steps: range
    pos: Tensor
    draft: Trajectory
    noise: ChainNoise
    chain_q: TokenChain
    t_p: int  # head steps of the target's chains for this block
    t_q: int  # and of the draft's (equal unless draft_head_steps says otherwise)


@dataclass
class _Check:
    """The target's side of a block: its chains and their trajectory (shared noise when aligned)."""

    chain_p: TokenChain
    target: Trajectory


@dataclass
class _Decision:
    x: Tensor  # (rows, d) the block's tokens after verification
    verdict: Verdict
    accepted: Tensor  # (rows,) bool
    rejected: Tensor  # (m,) row indices
    resampled: Resampled | None


@dataclass
class _Decoding:
    """The state of one speculative run; each phase of the loop above is one method."""

    target: ModelFamily
    draft: ModelFamily
    conditions: object
    sampling: SamplingConfig
    csd: CSDConfig
    plan: Plan
    steps_p: list[int]  # the target's head steps at each AR step (constant without a schedule)
    streams: dict[str, ImageStreams]
    timer: PhaseTimer
    trace: Trace
    tokens: Tensor  # (B, N, d)
    mask: Tensor  # (B, N) True where not yet made
    report: StepCallback

    @classmethod
    def start(cls, target, draft, conditions, seeds, sampling, csd, on_step) -> _Decoding:
        check_pair(target, draft)
        seeds = check_seeds(seeds)
        device = model_device(target)
        if model_device(draft) != device:
            raise ValueError(f"draft model is on {model_device(draft)}, the target on {device}: use one device")
        batch, n, d = len(seeds), target.seq_len, target.token_dim
        plan = target.plan(seeds, sampling, device)
        steps_p = head_step_schedule(target.head_steps(sampling.head_steps), sampling.head_steps_min, plan.num_steps)
        if csd.draft_head_steps is not None and any(t != csd.draft_head_steps for t in steps_p):
            if csd.align or csd.criterion != "aligned" or csd.trajectory_term != "none":
                raise ValueError(
                    f"draft_head_steps {csd.draft_head_steps} differs from the target's head steps "
                    f"{sorted(set(steps_p))}: "
                    "chains of different lengths share no noise and no per-step stds, so it needs align=False, "
                    "criterion 'aligned' and trajectory_term 'none'"
                )
        if csd.acceptance_unit == "token" and getattr(target, "tokens_per_row", 1) == 1:
            raise ValueError("acceptance_unit 'token' needs a family whose rows hold several tokens (xAR's cells)")
        streams = {name: ImageStreams(seeds, name, device) for name in ("chain", "accept", "resample", "independent")}
        return cls(
            target=target,
            draft=draft,
            conditions=target.check_conditions(conditions, batch, device),
            sampling=sampling,
            csd=csd,
            plan=plan,
            # Alignment shares every noise tensor, so both chains run the target's number of transitions.
            steps_p=steps_p,
            streams=streams,
            timer=PhaseTimer(device),
            trace=Trace.empty(batch, n, plan.sizes, {"sampling": asdict(sampling), "csd": asdict(csd)}),
            tokens=torch.zeros(batch, n, d, device=device),
            mask=torch.ones(batch, n, dtype=torch.bool, device=device),
            report=on_step or (lambda done, total, phase: None),
        )

    @property
    def batch(self) -> int:
        return self.tokens.shape[0]

    def _cfg_rows(self, steps: range) -> Tensor:
        """The guidance scale of every row of a block (its AR steps may have different scales)."""
        per_step = [torch.full((self.batch * self.plan.sizes[j],), self.plan.cfg[j]) for j in steps]
        return cat_rows(per_step, self.batch).to(self.tokens.device)

    def _noise(self, stream: str, k: int, steps: int) -> ChainNoise:
        return draw_chain_noise(self.streams[stream], k, steps, self.tokens.shape[-1])

    def _step(self, model, tokens, mask, s: int, phase: str, steps: int) -> tuple[Trajectory, ChainNoise, TokenChain]:
        pos, noise = self.plan.positions(s), self._noise("chain", self.plan.sizes[s], steps)
        args = (self.conditions, pos, self.plan.cfg[s], noise, self.sampling, steps, self.timer, phase)
        traj, chain = predict_step(model, tokens, mask, *args)
        return traj, noise, chain

    def prefill(self) -> int:
        """Target-only steps until ``prefill`` of the tokens exist; returns the first step to draft."""
        s, made, n = 0, 0, self.tokens.shape[1]
        while s < self.plan.num_steps and made < self.csd.prefill * n:
            traj, _, _ = self._step(self.target, self.tokens, self.mask, s, "prefill", self.steps_p[s])
            pos = self.plan.positions(s)
            commit(self.tokens, self.mask, pos, traj.x)
            self.trace.record_made(pos, s, Maker.PREFILL)
            if self.trace.details is not None:
                with self.timer("inspection"):  # a measurement: kept out of decoding times
                    self.trace.record_chain(pos, "target", traj)
            self.trace.record_pass("target")
            made += self.plan.sizes[s]
            s += 1
            self.report(s, self.plan.num_steps, "pre-fill")
        return s

    def blocks(self, start: int) -> Iterator[range]:
        """The AR steps of each block: gamma (or the schedule's entry) at a time, from ``start``."""
        s, block = start, 0
        while s < self.plan.num_steps:
            steps = range(s, min(s + self.csd.block_length(block), self.plan.num_steps))
            yield steps
            s, block = steps.stop, block + 1

    def draft_block(self, steps: range) -> _Block:
        """The draft makes the block's AR steps one by one, feeding back its own tokens."""
        tokens, mask = self.tokens.clone(), self.mask.clone()
        t_p = self.steps_p[steps.start]
        t_q = self.csd.draft_head_steps or t_p
        trajs, noises, chains = [], [], []
        for j in steps:
            traj, noise, chain = self._step(self.draft, tokens, mask, j, "draft", t_q)
            pos = self.plan.positions(j)
            commit(tokens, mask, pos, traj.x)
            trajs.append(traj)
            noises.append(noise)
            chains.append(chain)
            self.trace.record_made(pos, j, None)
            self.trace.record_pass("draft")
            self.report(j + 1, self.plan.num_steps, "draft")
        b = self.batch
        pos = torch.cat([self.plan.positions(j) for j in steps], dim=1)
        joined = (Trajectory.join(trajs, b), ChainNoise.join(noises, b), self.draft.join(chains, b))
        block = _Block(steps, pos, *joined, t_p, t_q)
        if self.trace.details is not None:
            with self.timer("inspection"):  # a measurement: kept out of decoding times
                self.trace.record_chain(pos, "draft", block.draft)
        return block

    def verify(self, block: _Block) -> _Check:
        """The target's chains for the block from one pass over the context before it; the draft-target
        distances (both noise choices with ``counterfactual``) go to the trace."""
        with self.timer("target_backbone"):
            cfg = self._cfg_rows(block.steps)
            args = (self.conditions, block.pos, cfg, self.sampling, block.t_p)
            chain_p = self.target.verify(self.tokens, self.mask, *args, drafted=block.draft.x)
        self.trace.record_pass("target")
        rows, aligned = block.pos.shape[1], self.csd.align
        with self.timer("target_head"):
            target = chain_p.run(block.noise if aligned else self._noise("independent", rows, block.t_p))
        self.trace.record_distance(block.pos, (block.draft.x - target.x).norm(dim=-1), aligned)
        if self.trace.details is not None:
            with self.timer("inspection"):  # a measurement: kept out of decoding times
                self.trace.record_chain(block.pos, "target", target)
        if self.csd.counterfactual and block.t_q == block.t_p:  # the other noise choice needs equal lengths
            with self.timer("counterfactual"):
                other = chain_p.run(self._noise("independent", rows, block.t_p) if aligned else block.noise)
            self.trace.record_distance(block.pos, (block.draft.x - other.x).norm(dim=-1), not aligned)
        return _Check(chain_p, target)

    def accept_or_resample(self, block: _Block, check: _Check) -> _Decision:
        """The acceptance test for every drafted token; rejected ones are redrawn from max(0, p - q)."""
        units = self.units()
        if units > 1:
            return self._accept_units(block, check, units)
        with self.timer("verify"):
            if self.csd.criterion == "aligned":
                verdict = aligned_verdict(block.draft, check.target, self.csd.tau_v, self.csd.trajectory_term)
                x = block.draft.x.clone()
            else:
                mean_p, std_p = check.chain_p.evaluate(block.draft.states)
                verdict = exact_verdict(block.draft, mean_p, std_p)
                x = mean_p[-1].clone()  # the target's last (noise-free) step on the draft path
            uniforms = self.streams["accept"].rand(block.pos.shape[1]).reshape(-1)
            accepted = accept(verdict, uniforms)
        self.trace.record_accept_draw(block.pos, uniforms)
        with self.timer("resample"):
            rejected = (~accepted).nonzero().squeeze(-1)
            resampled = self._resample(block, check, verdict, rejected) if rejected.numel() else None
            if resampled is not None:
                x[rejected] = resampled.x
        return _Decision(x, verdict, accepted, rejected, resampled)

    def units(self) -> int:
        """Tokens per row under the acceptance unit: 1 for "row"; a family's tokens per row for "token"."""
        if self.csd.acceptance_unit == "row":
            return 1
        units = getattr(self.target, "tokens_per_row", 1)
        if units == 1:
            raise ValueError("acceptance_unit 'token' needs a family whose rows hold several tokens (xAR's cells)")
        return units

    def _accept_units(self, block: _Block, check: _Check, units: int) -> _Decision:
        """The aligned test and the resampler on every token of every row alone (acceptance_unit "token");
        a row is accepted when all of its tokens are; the per-row results aggregate its tokens'."""
        draft, target = split_rows(block.draft, units), split_rows(check.target, units)
        with self.timer("verify"):
            verdict = aligned_verdict(draft, target, self.csd.tau_v, self.csd.trajectory_term)
            uniforms = self.streams["accept"].rand(block.pos.shape[1] * units).reshape(-1)
            accepted = accept(verdict, uniforms)
        x = draft.x.clone()
        with self.timer("resample"):
            rejected = (~accepted).nonzero().squeeze(-1)
            if rejected.numel():
                tokens = _Block(block.steps, block.pos, draft, block.noise, block.chain_q, block.t_p, block.t_q)
                resampled = self._resample(tokens, _Check(check.chain_p, target), verdict, rejected, units)
                x[rejected] = resampled.x
        rows = lambda a: a.reshape(-1, units)
        row_verdict = Verdict(rows(verdict.trajectory).sum(1), rows(verdict.final).sum(1))
        row_ok = rows(accepted).all(1)
        row_rejected = (~row_ok).nonzero().squeeze(-1)
        tries = torch.zeros(accepted.shape, dtype=torch.long, device=accepted.device)
        capped = torch.zeros(accepted.shape, dtype=torch.bool, device=accepted.device)
        if rejected.numel():
            tries[rejected], capped[rejected] = resampled.tries.long(), resampled.capped
        per_row = Resampled(x=None, tries=rows(tries).sum(1)[row_rejected], capped=rows(capped).any(1)[row_rejected])
        self.trace.record_unit_acceptance(block.pos, rows(accepted).float().mean(1))
        return _Decision(x.reshape(-1, block.draft.x.shape[-1]), row_verdict, row_ok, row_rejected, per_row)

    def _resample(self, block: _Block, check: _Check, verdict: Verdict, rejected: Tensor, units: int = 1) -> Resampled:
        """Draw the rejected rows from max(0, p - q) / Z; a capped row takes the target's own sample.
        ``units``: rows per drafted position (the tokens of a cell under acceptance_unit "token")."""
        per_image, stream = block.pos.shape[1] * units, self.streams["resample"]
        owner = lambda pending: torch.bincount(rejected[pending] // per_image, minlength=self.batch)
        fallback = check.target.x[rejected]
        d = fallback.shape[-1]
        if self.csd.criterion == "aligned":  # both final Gaussians, weighted by the trajectory term
            w = self.csd.resample_widening
            p, q = check.target, block.draft

            def draws(k: int, pending: Tensor) -> tuple[Tensor, Tensor]:
                counts = owner(pending)
                return stream.randn_rows(counts, k, d), stream.rand_rows(counts, k)

            return resample_gaussian(
                p_mean=p.final_mean[rejected],
                p_std=w * p.final_std[rejected],
                q_mean=q.final_mean[rejected],
                q_std=w * q.final_std[rejected],
                draws=draws,
                fallback=fallback,
                max_tries=self.csd.max_tries,
                log_weight=-verdict.trajectory[rejected],
            )
        chain_p, chain_q = check.chain_p.select(rejected), block.chain_q.select(rejected)

        def propose(pending: Tensor) -> tuple[Tensor, Tensor]:  # a whole target path, weighed by q / p
            raw = stream.randn_rows(owner(pending), block.t_p, d)  # (m, T, d)
            path = chain_p.select(pending).run(ChainNoise(raw[:, 0], raw[:, 1:].transpose(0, 1)))
            mean_q, std_q = chain_q.select(pending).evaluate(path.states)
            return path.x, path_log_ratio(path.states, mean_q, std_q, path.mean, path.std)

        return resample_paths(propose, lambda pending: stream.rand_rows(owner(pending)), fallback, self.csd.max_tries)

    def commit_block(self, block: _Block, block_id: int, decision: _Decision) -> None:
        commit(self.tokens, self.mask, block.pos, decision.x)
        maker = torch.full_like(decision.accepted, int(Maker.ACCEPTED), dtype=torch.int8)
        tries = torch.zeros_like(decision.accepted, dtype=torch.int32)
        if decision.resampled is not None:
            res = decision.resampled
            maker[decision.rejected] = torch.where(res.capped, int(Maker.CAPPED), int(Maker.RESAMPLED)).to(torch.int8)
            tries[decision.rejected] = res.tries.to(torch.int32)
        v = decision.verdict
        self.trace.record_block(block.pos, block_id, maker, v.accept_prob, v.trajectory, v.final, tries)
        self.report(block.steps.stop, self.plan.num_steps, "verify")

    def finish(self) -> Generation:
        self.trace.record_times(self.timer.times)
        return Generation(self.tokens.float().cpu(), self.trace)
