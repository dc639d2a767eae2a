"""Continuous speculative decoding with block verification (DESIGN.md section 2).

pre-fill (target alone) -> repeat { draft gamma AR steps -> the target's chains for the whole block
at once (:meth:`csd.family.ModelFamily.verify`: a masked family's one backbone pass over the context
before the block; xAR's flow chain over the block's cells, each given the cells drafted before it)
-> run them (shared noise when aligned) -> accept or resample every drafted row -> commit the block }.
The loop does not know the criterion: each one answers verdict, resample and rows alike.

Under ``block="exact"`` the target sees each drafted step given the block's drafted steps before it (a
masked family's views of the block, one pass each; ``block="context"`` stops there and commits the whole
block), and the block is committed through its first AR step with a rejection in any image (its rejected
tokens redrawn); the next block drafts from the step after it. Whether a step is committed depends only on
the steps before it, and each committed step's tokens are accepted or redrawn given their own context, so
every token follows the target given its context: a run at any gamma follows gamma 1's distribution (which
images it makes depends on the batch, through the shared commit point).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from csd.acceptance import Criterion, Decision, Proposal, accept
from csd.config import CSDConfig, SamplingConfig
from csd.core.chain import ChainNoise, Trajectory, cat_rows
from csd.core.rng import ImageStreams
from csd.decoding import (
    Generation,
    PhaseTimer,
    StepCallback,
    StepInput,
    commit,
    draw_chain_noise,
    finished,
    new_canvas,
    predict_step,
    trace_dtype,
)
from csd.family import ModelFamily, ModelState, Plan, TokenChain
from csd.run_setup import set_up_run
from csd.trace import Maker, Trace


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
    s = run.prefill()  # 1. the target alone until a fraction csd.prefill of the tokens exists
    for block_id, steps in enumerate(run.blocks(s)):  # from the step after the last one committed
        block = run.draft_block(steps)  # 2. gamma AR steps of the draft, on its own tokens
        proposal = run.verify(block)  # 3. the target's chains for the whole block at once
        decision = run.accept_or_resample(block, proposal)  # 4. min(1, r), else a draw from max(0, p - q)
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
    sizes: list[int]  # tokens (rows) per image of each of its AR steps
    kept: int = 0  # AR steps committed, once decided (all of them under the published block)

    @property
    def kept_rows(self) -> int:
        """Rows per image committed: those of the kept steps."""
        return sum(self.sizes[: self.kept])


@dataclass(frozen=True)
class _RowDraws:
    """The resampler's random numbers for rejected rows, each from its image's stream."""

    stream: ImageStreams
    rejected: Tensor  # (m,) rejected rows of the block
    per_image: int  # rows per image in the block
    batch: int
    dtype: torch.dtype  # the run's: drawn in float32 (every precision's numbers), then cast

    def _counts(self, pending: Tensor) -> Tensor:
        return torch.bincount(self.rejected[pending] // self.per_image, minlength=self.batch)

    def normal(self, pending: Tensor, *shape: int) -> Tensor:
        return self.stream.randn_rows(self._counts(pending), *shape).to(self.dtype)

    def uniform(self, pending: Tensor, *shape: int) -> Tensor:
        return self.stream.rand_rows(self._counts(pending), *shape).to(self.dtype)


@dataclass
class _Decoding:
    """The state of one speculative run; each phase of the loop above is one method."""

    target: ModelFamily
    draft: ModelFamily
    target_state: ModelState  # each model's state of the generation (its conditions and caches)
    draft_state: ModelState
    sampling: SamplingConfig
    csd: CSDConfig
    draft_sampling: SamplingConfig  # the draft's: the target's, on draft_head_sampler where one is set
    criterion: Criterion
    plan: Plan
    steps_p: list[int]  # the target's head steps at each AR step (constant without a schedule)
    streams: dict[str, ImageStreams]
    timer: PhaseTimer
    trace: Trace
    tokens: Tensor  # (B, N, d)
    mask: Tensor  # (B, N) True where not yet made
    report: StepCallback
    committed: int = 0  # AR steps committed so far (where the next block starts)

    @classmethod
    def start(cls, target, draft, conditions, seeds, sampling, csd, on_step) -> _Decoding:
        run = set_up_run(target, conditions, seeds, sampling, csd, draft)
        batch, n, d = run.batch, target.seq_len, target.token_dim
        tokens, mask = new_canvas(batch, n, d, run.sampling, run.device)
        return cls(
            target=target,
            draft=draft,
            target_state=target.start(run.conditions, run.sampling),
            draft_state=draft.start(run.conditions, run.draft_sampling),
            sampling=run.sampling,
            csd=csd,
            draft_sampling=run.draft_sampling,
            criterion=run.criterion,
            plan=run.plan,
            # Alignment shares every noise tensor, so both chains run the target's number of transitions.
            steps_p=run.head_steps,
            streams=run.streams,
            timer=PhaseTimer(run.device),
            trace=Trace.empty(
                batch,
                n,
                run.plan.sizes,
                {"sampling": run.sampling.knob_values(), "csd": csd.knob_values()},
                trace_dtype(run.sampling),
                defer=run.device.type == "cuda",
            ),
            tokens=tokens,
            mask=mask,
            report=on_step or (lambda done, total, phase: None),
        )

    @property
    def batch(self) -> int:
        return self.tokens.shape[0]

    def _cfg_rows(self, steps: range) -> Tensor:
        """The guidance scale of every row of a block (its AR steps may have different scales)."""
        per_step = [
            torch.full((self.batch * self.plan.sizes[j],), self.plan.cfg[j], dtype=self.tokens.dtype) for j in steps
        ]
        return cat_rows(per_step, self.batch).to(self.tokens.device)

    def _noise(self, stream: str, k: int, steps: int) -> ChainNoise:
        return draw_chain_noise(self.streams[stream], k, steps, self.tokens.shape[-1], self.tokens.dtype)

    def _step(self, model, tokens, mask, s: int, phase: str, steps: int) -> tuple[Trajectory, ChainNoise, TokenChain]:
        pos, noise = self.plan.positions(s), self._noise("chain", self.plan.sizes[s], steps)
        draft = phase == "draft"
        config, state = (self.draft_sampling, self.draft_state) if draft else (self.sampling, self.target_state)
        step = StepInput(state, pos, self.plan.cfg[s], noise, config, steps, phase)
        traj, chain = predict_step(model, tokens, mask, step, self.timer)
        return traj, noise, chain

    def prefill(self) -> int:
        """Target-only steps until ``prefill`` of the tokens exist; returns the first step to draft."""
        s, made, n = 0, 0, self.tokens.shape[1]
        while s < self.plan.num_steps and made < self.csd.prefill * n:
            traj, _, _ = self._step(self.target, self.tokens, self.mask, s, "prefill", self.steps_p[s])
            pos = self.plan.positions(s)
            commit(self.tokens, self.mask, pos, traj.x)
            self.trace.record_made(pos, s, Maker.PREFILL)
            self._inspect(pos, "target", traj)
            self.trace.record_pass("target")
            made += self.plan.sizes[s]
            s += 1
            self.report(s, self.plan.num_steps, "pre-fill")
        self.committed = s
        return s

    def _inspect(self, pos: Tensor, model: str, traj: Trajectory) -> None:
        """Keep a chain's transitions for inspection, when asked; a measurement, kept out of decoding times."""
        if self.trace.details is not None:
            with self.timer("inspection"):
                self.trace.record_chain(pos, model, traj)

    def blocks(self, start: int) -> Iterator[range]:
        """The AR steps of each block: gamma (or the schedule's entry) at a time, from ``start``, each block
        from the step after the last one committed."""
        self.committed, block = start, 0
        while self.committed < self.plan.num_steps:
            s = self.committed
            yield range(s, min(s + self.csd.block_length(block), self.plan.num_steps))
            block += 1

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
        block = _Block(steps, pos, *joined, t_p, t_q, [self.plan.sizes[j] for j in steps])
        self._inspect(pos, "draft", block.draft)
        return block

    def verify(self, block: _Block) -> Proposal:
        """What the criterion reads: the draft's side of the block and the target's chains for it from one
        verification (one counted target pass; a masked
        family's views under the context or exact block, one per drafted step); the draft-target distances
        (both noise choices with ``counterfactual``) go to the trace."""
        sizes = None if self.csd.block == "published" else block.sizes
        passes = 1 if sizes is None or self.target.traits.verifies_in_context else len(sizes)
        self.timer.work["target_backbone"]["calls"] += passes - 1  # a masked family's views: a pass per step
        with self.timer("target_backbone"):
            cfg = self._cfg_rows(block.steps)
            chain_p = self.target.verify(
                self.target_state, self.tokens, self.mask, block.pos, cfg, block.t_p, block.draft.x, sizes
            )
        for _ in range(passes):
            self.trace.record_pass("target")
        rows, aligned = block.pos.shape[1], self.csd.align
        with self.timer("target_head", tokens=block.pos.numel(), steps=block.t_p):
            target = chain_p.run(block.noise if aligned else self._noise("independent", rows, block.t_p))
        self.trace.record_distance(block.pos, (block.draft.x - target.x).norm(dim=-1), aligned)
        self._inspect(block.pos, "target", target)
        if self.csd.counterfactual and block.t_q == block.t_p:  # the other noise choice needs equal lengths
            with self.timer("counterfactual"):
                other = chain_p.run(self._noise("independent", rows, block.t_p) if aligned else block.noise)
            self.trace.record_distance(block.pos, (block.draft.x - other.x).norm(dim=-1), not aligned)
        return Proposal(block.draft, target, block.chain_q, chain_p)

    def accept_or_resample(self, block: _Block, proposal: Proposal) -> Decision:
        """The criterion's test for every unit it tests (a row, or each token of it); rejected ones are redrawn
        from max(0, p - q); the decision per row goes to the trace."""
        crit, per_image = self.criterion, block.pos.shape[1] * self.criterion.units
        with self.timer("verify"):
            verdict, x = crit.verdict(proposal)
            uniforms = self.streams["accept"].rand(per_image).reshape(-1).to(self.tokens.dtype)
            accepted = accept(verdict, uniforms)
            live = self._keep(block, accepted)
        with self.timer("resample"):
            rejected = (~accepted & live).nonzero().squeeze(-1)
            resampled = None
            if rejected.numel():
                draws = _RowDraws(self.streams["resample"], rejected, per_image, self.batch, self.tokens.dtype)
                resampled = crit.resample(proposal, verdict, rejected, draws)
                x[rejected] = resampled.x
        decision = crit.rows(Decision(x, verdict, uniforms, accepted, rejected, resampled))
        self.trace.record_accept_draw(block.pos, decision.draws)
        self.trace.record_unit_acceptance(block.pos, decision.unit_accepted)
        return decision

    def _keep(self, block: _Block, accepted: Tensor) -> Tensor:
        """Decide the AR steps of the block to commit (``block.kept``): all of them, or under the exact block
        those through its first step with a rejection in any image (one read on the host). Returns which
        units (image-major, as ``accepted``) are committed: the resampler redraws only those."""
        b, units = self.batch, self.criterion.units
        block.kept = len(block.steps)
        if self.csd.block == "exact" and block.kept > 1:
            rejected = ~accepted.reshape(b, -1, units).all(-1)  # (B, rows per image)
            per_step = torch.stack([part.any() for part in rejected.split(block.sizes, dim=1)])
            block.kept = int(per_step.to(torch.int8).argmax()) + 1 if bool(per_step.any()) else block.kept
        live = torch.zeros(b, sum(block.sizes), units, dtype=torch.bool, device=accepted.device)
        live[:, : block.kept_rows] = True
        return live.reshape(-1)

    def commit_block(self, block: _Block, block_id: int, decision: Decision) -> None:
        """Commit the kept steps of the block (:meth:`_keep`); the next block starts after them."""
        maker = torch.full_like(decision.accepted, int(Maker.ACCEPTED), dtype=torch.int8)
        tries = torch.zeros_like(decision.accepted, dtype=torch.int32)
        if decision.resampled is not None:
            res = decision.resampled
            cap = Maker.ZEROED if res.fallback == "zero" else Maker.CAPPED
            maker[decision.rejected] = torch.where(res.capped, int(cap), int(Maker.RESAMPLED)).to(torch.int8)
            tries[decision.rejected] = res.tries.to(torch.int32)
        v, b, kept = decision.verdict, self.batch, block.kept_rows
        rows = lambda t: t.reshape(b, -1, *t.shape[1:])[:, :kept].reshape(-1, *t.shape[1:])  # the kept rows
        pos = block.pos[:, :kept]
        commit(self.tokens, self.mask, pos, rows(decision.x))
        values = (rows(maker), rows(v.accept_prob), rows(v.trajectory), rows(v.final), rows(tries))
        self.trace.record_block(pos, block_id, *values)
        self.trace.record_kept(block.kept, len(block.steps))
        self.committed = block.steps.start + block.kept
        self.report(self.committed, self.plan.num_steps, "verify")

    def finish(self) -> Generation:
        self.trace.record_times(self.timer.finish(), self.timer.work)
        self.trace.flush()
        return Generation(finished(self.tokens), self.trace)
