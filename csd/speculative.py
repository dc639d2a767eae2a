"""Continuous speculative decoding with block verification (DESIGN.md section 2).

pre-fill (target alone) -> repeat { draft gamma AR steps -> the target's chains for the whole block
at once (:meth:`csd.family.ModelFamily.verify`: a masked family's one backbone pass over the context
before the block; xAR's flow chain over the block's cells, each given the cells drafted before it)
-> run them (shared noise when aligned) -> accept or resample every drafted row -> commit the block }.
The loop does not know the criterion: each one answers verdict, resample and rows alike.

Under the exact block (``CSDConfig.block``, :class:`csd.settings.Verification`) the target sees each drafted step
given the block's drafted steps before it (a masked family's views of the block, as rows of its one pass, or
under ``views="per_view"`` a pass each; the context block stops there and commits the whole block), and the
block is committed through its first AR step with a rejection in any image (its rejected tokens redrawn); the
next block drafts from the step after it. Whether a step is committed depends only on the steps before it,
and each committed step's tokens are accepted or redrawn given their own context, so every token follows the
target given its context: a run at any gamma follows gamma 1's distribution (which images it makes depends on
the batch, through the shared commit point). Where verification also gives the
target's chain of the step after the block (a causal family, ``FamilyTraits.verifies_next``), a block whose
every token is accepted is followed by that step, made by the target from the same pass (LLM speculative
decoding's bonus token): one target pass then commits gamma + 1 steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from csd.acceptance import Decision, Proposal, Verdict
from csd.config import CSDConfig, SamplingConfig
from csd.core.chain import ChainNoise, Trajectory
from csd.core.resample import Resampled
from csd.core.rng import ImageStreams
from csd.decoding import Block, Generation, StepCallback, commit
from csd.family import ModelFamily, TokenChain
from csd.run_setup import Run


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
    sampling, csd = sampling or SamplingConfig(), csd or CSDConfig()
    run = Run.start(target, conditions, seeds, sampling, csd, draft, on_step=on_step, keep_details=keep_details)
    return decode(run)


def decode(run: Run) -> Generation:
    """The decoding loop of every run: CSD, or one model alone (it pre-fills to the end: no block)."""
    prefill(run)  # 1. the target alone until a fraction csd.prefill of the tokens exists
    while not run.done:  # each block from the step after the last one committed
        block = draft_block(run)  # 2. gamma AR steps of the draft, on its own tokens
        proposal = verify(run, block)  # 3. the target's chains for the whole block at once
        decision = accept_or_resample(run, block, proposal)  # 4. min(1, r), else a draw from max(0, p - q)
        commit_block(run, block, decision)  # 5. the block's tokens join the context
        if block.agreed == len(block.steps) and run.target.traits.verifies_next and not run.done:
            keep_next(run)  # 6. a wholly accepted block: the target's next step, from the verification's pass
    return run.recorder.finish(run.tokens)


def make_step(
    run: Run, model: ModelFamily, tokens: Tensor, mask: Tensor, s: int, steps: int, phase: str
) -> tuple[Trajectory, ChainNoise, TokenChain]:
    """AR step ``s`` of one model on a canvas (``tokens``, ``mask``): its pass over the context (timed as
    ``{phase}_backbone``), the chains of the step's tokens, ``steps`` transitions each, on the run's chain
    noise (``{phase}_head``), and their tokens written to the canvas. The draft's steps (``phase`` "draft")
    run on its sampler settings and state of the generation. Returns the step's trajectories, noise and chains."""
    pos, noise = run.plan.positions(s), run.noise("chain", run.plan.sizes[s], steps)
    drafting = phase == "draft" and run.draft is not None  # a block's step, not a draft-only run's
    config, state = (run.draft_sampling, run.draft_state) if drafting else (run.sampling, run.target_state)
    with run.recorder.timed(f"{phase}_backbone"):
        cfg = torch.full((pos.numel(),), run.plan.cfg[s], device=pos.device, dtype=config.dtype)
        chain = model.predict(state, tokens, mask, pos, cfg, steps, known=sum(run.plan.sizes[:s]))
    with run.recorder.timed(f"{phase}_head", tokens=pos.numel(), steps=config.head_calls(steps)):  # Heun: two calls
        traj = chain.run(noise)
    commit(tokens, mask, pos, traj.x)
    return traj, noise, chain


def prefill(run: Run) -> None:
    """The target alone, AR step by AR step, until a fraction ``csd.prefill`` of the tokens exists (in a run of
    one model: all of them)."""
    made = 0
    while not run.done and made < run.prefill_tokens:
        s = run.committed
        traj, _, _ = make_step(run, run.target, run.tokens, run.mask, s, run.head_steps[s], run.recorder.phase)
        run.committed, made = s + 1, made + run.plan.sizes[s]
        run.recorder.made(run.plan.positions(s), s, traj)


def keep_next(run: Run) -> None:
    """The target makes the step after a wholly accepted block from the hidden state its verification left (no
    backbone pass of its own: the state holds it), on fresh chain noise, as a target-only run would make it."""
    s = run.committed
    traj, _, _ = make_step(run, run.target, run.tokens, run.mask, s, run.head_steps[s], "next")
    run.committed = s + 1
    run.recorder.made_next(run.plan.positions(s), s, traj)


def draft_block(run: Run) -> Block:
    """The draft makes the next block's AR steps one by one, feeding back its own tokens: gamma of them (or
    the schedule's entry), from the step after the last one committed."""
    start = run.committed
    steps = range(start, min(start + run.csd.block_length(run.blocks), run.plan.num_steps))
    tokens, mask = run.tokens.clone(), run.mask.clone()
    t_p = run.head_steps[start]
    t_q = run.csd.draft_head_steps or t_p
    trajs, noises, chains = [], [], []
    for j in steps:
        traj, noise, chain = make_step(run, run.draft, tokens, mask, j, t_q, "draft")
        trajs.append(traj)
        noises.append(noise)
        chains.append(chain)
        run.recorder.drafted(j)
    b, sizes = run.batch, [run.plan.sizes[j] for j in steps]
    pos = torch.cat([run.plan.positions(j) for j in steps], dim=1)
    drafted = Trajectory.join(trajs, b), ChainNoise.join(noises, b), run.draft.join(chains, b)
    run.blocks += 1
    return Block(run.blocks - 1, steps, pos, sizes, t_p, t_q, *drafted)


def verify(run: Run, block: Block) -> Proposal:
    """What the criterion reads: the draft's side of the block and the target's chains for it from one
    verification (one target pass; a masked family's views of a context or exact block as rows of it, or under
    ``views="per_view"`` a pass each: :func:`_verify_per_view`), run on the draft's noise when aligned."""
    sizes = None if run.csd.block.kind == "published" else block.sizes
    passes = len(block.sizes) if run.csd.block.views == "per_view" else 1
    with run.recorder.timed("target_backbone", calls=passes):
        per_row = [run.plan.cfg[j] for j, size in zip(block.steps, block.sizes, strict=True) for _ in range(size)]
        cfg = torch.tensor(per_row * run.batch, dtype=run.dtype, device=run.tokens.device)  # image-major rows
        known = sum(run.plan.sizes[: block.steps.start])
        if passes > 1:
            chain_p = _verify_per_view(run, block, cfg, known)
        else:
            chain_p = run.target.verify(
                run.target_state, run.tokens, run.mask, block.pos, cfg, block.t_p, block.draft.x, sizes, known=known
            )
    rows = block.pos.shape[1]
    noise = block.noise if run.csd.align else run.noise("independent", rows, block.t_p)
    with run.recorder.timed("target_head", tokens=block.pos.numel(), steps=block.t_p):
        target = chain_p.run(noise)
    proposal = Proposal(block.draft, target, block.chain_q, chain_p)
    other = None  # the noise choice not taken, for the counterfactual distance (chains of equal lengths only)
    if run.csd.counterfactual and block.t_q == block.t_p:
        other = run.noise("independent", rows, block.t_p) if run.csd.align else block.noise
    run.recorder.verified(block, proposal, passes, other)
    return proposal


def _verify_per_view(run: Run, block: Block, cfg: Tensor, known: int) -> TokenChain:
    """The target's chains of a block, a pass per view: step k predicted on the canvas with the block's drafted
    steps before k (the views :meth:`csd.models.mar.adapter.MaskedARFamily.verify` stacks as rows of one pass)."""
    b, d = run.batch, run.tokens.shape[-1]
    tokens, mask, chains, start = run.tokens.clone(), run.mask.clone(), [], 0
    cfg, drafted = cfg.reshape(b, -1), block.draft.x.reshape(b, -1, d)
    for size in block.sizes:
        at = slice(start, start + size)
        pos, step_cfg = block.pos[:, at], cfg[:, at].reshape(-1)
        chains.append(run.target.predict(run.target_state, tokens, mask, pos, step_cfg, block.t_p, known + start))
        commit(tokens, mask, pos, drafted[:, at])
        start += size
    return run.target.join(chains, b)


def accept_or_resample(run: Run, block: Block, proposal: Proposal) -> Decision:
    """The criterion's test for every unit it tests (a row, or each token of it); rejected ones are redrawn
    from max(0, p - q), in rounds or, where the criterion's resampler is one-pass, in one pass. Returns the
    decision per row."""
    crit, per_image = run.criterion, block.pos.shape[1] * run.criterion.units
    with run.recorder.timed("verify"):
        verdict, x = crit.verdict(proposal)
        uniforms = run.uniforms("accept", per_image)
        accepted = verdict.accept(uniforms)
        live = _keep(run, block, accepted)
    with run.recorder.timed("resample"):
        rejected = ~accepted & live  # (units,) the committed units to redraw
        redraw = _resample_one_pass if crit.one_pass else _resample_rounds
        x, resampled = redraw(run, proposal, verdict, x, rejected, per_image)
    return crit.rows(Decision(x, verdict, uniforms, accepted, rejected, resampled))


def _resample_rounds(
    run: Run, proposal: Proposal, verdict: Verdict, x: Tensor, rejected: Tensor, per_image: int
) -> tuple[Tensor, Resampled | None]:
    """Redraw the ``rejected`` units (x's rows, in place) in rounds of tries for those still pending: their
    selection, each round and each image's count of draws are read on the host. Returns x and the
    resampler's tries and capped per unit (None where nothing is rejected)."""
    rows = rejected.nonzero().squeeze(-1)
    if not rows.numel():
        return x, None
    draws = _RowDraws(run.streams["resample"], rows, per_image, run.batch, run.dtype)
    res = run.criterion.resample(proposal, verdict, rows, draws)
    x[rows] = res.x
    tries = torch.zeros_like(rejected, dtype=res.tries.dtype).index_put_((rows,), res.tries)
    capped = torch.zeros_like(rejected).index_put_((rows,), res.capped)
    return x, Resampled(None, tries, capped, res.fallback)


def _resample_one_pass(
    run: Run, proposal: Proposal, verdict: Verdict, x: Tensor, rejected: Tensor, per_image: int
) -> tuple[Tensor, Resampled]:
    """Redraw the ``rejected`` units in one pass: every unit of the block draws ``max_tries`` proposals, the
    same count in every image (:class:`_BlockDraws`), and a rejected one takes its first kept one. Fixed
    shapes only: nothing is read on the host. Returns x and the tries and capped per unit."""
    draws = _BlockDraws(run.streams["resample"], per_image, run.dtype)
    res = run.criterion.resample(proposal, verdict, None, draws)
    x = torch.where(rejected.unsqueeze(-1), res.x, x)
    return x, Resampled(None, torch.where(rejected, res.tries, 0), res.capped & rejected, res.fallback)


def _keep(run: Run, block: Block, accepted: Tensor) -> Tensor:
    """Decide the AR steps of the block to commit (``block.kept``): all of them, or under the exact block
    those through its first step with a rejection in any image (one read on the host; ``block.agreed``: the
    steps before it, accepted whole). Returns which units (image-major, as ``accepted``) are committed: the
    resampler redraws only those."""
    b, units = run.batch, run.criterion.units
    block.kept = len(block.steps)
    exact = run.csd.block.kind == "exact"
    if exact and (block.kept > 1 or run.target.traits.verifies_next):
        rejected = ~accepted.reshape(b, -1, units).all(-1)  # (B, rows per image)
        per_step = [part.any() for part in rejected.split(block.sizes, dim=1)]
        first = int(torch.stack([*per_step, per_step[0].new_ones(())]).to(torch.int8).argmax())  # past the end: none
        block.kept, block.agreed = min(first + 1, block.kept), first
    live = torch.zeros(b, sum(block.sizes), units, dtype=torch.bool, device=accepted.device)
    live[:, : block.kept_rows] = True
    return live.reshape(-1)


def commit_block(run: Run, block: Block, decision: Decision) -> None:
    """Commit the kept steps of the block (:func:`_keep`); the next block starts after them."""
    commit(run.tokens, run.mask, block.pos[:, : block.kept_rows], block.kept_of(decision.x))
    for state in (run.target_state, run.draft_state):  # the drafted tokens after the accepted steps may differ
        state.rewind(sum(run.plan.sizes[: block.steps.start + block.agreed]))
    run.committed = block.steps.start + block.kept
    run.recorder.committed(block, decision)


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


@dataclass(frozen=True)
class _BlockDraws:
    """The one-pass resampler's random numbers: one row per row of the block (``pending`` None), drawn as
    fixed shapes from each image's stream, so an image's draws depend neither on the verdicts nor on the
    other images."""

    stream: ImageStreams
    per_image: int  # rows per image in the block
    dtype: torch.dtype  # the run's: drawn in float32 (every precision's numbers), then cast

    def normal(self, pending: None, *shape: int) -> Tensor:
        return self.stream.randn(self.per_image, *shape).reshape(-1, *shape).to(self.dtype)

    def uniform(self, pending: None, *shape: int) -> Tensor:
        return self.stream.rand(self.per_image, *shape).reshape(-1, *shape).to(self.dtype)
