"""The project's NextStep-1 reproduces the official implementation's numbers (stepfun-ai/NextStep-1 at 6e49bae,
transformers 4.49.0) on a tiny random model.

tests/data/nextstep_reference.pt was made by tests/data/make_nextstep_reference.py (its docstring has the
command and every convention; the file's ``notes`` too) from the official classes at hidden 64, 2 layers, 4
heads over 2 KV heads of 16, biased q/k/v and an unbiased output, a flow head of width 32 and 2 blocks, 16-wide
tokens on a 3 x 3 grid, every weight random (the biases and modulations the official init zeroes too).

Each comparison's figure is the relative error max |project - official| / max |official| over the entries
compared (:func:`relative`). Two runs of the project's model, each against its own reference:

* float32 against the official float32 run ("float32"): at most 1e-5, the issue's goal. float32 rounding (6e-8)
  grows through the decoder, the guided chains and the tokens fed back: measured at most 2.3e-6 (a guided
  grid's head conditions, with gen_pos_embed), the same under two threads and with oneDNN off, 2.2e-6 and
  1.4e-6 under the default and AVX2 capabilities (tests/kernels.py): the bound is over 4x the worst;
* float64 against the official float64 run with its float32 casts lifted ("float64_exact": the official float64
  path rounds RMSNorm, RoPE, the time embedding and the whole sampler to float32, which the project's float64
  runs do not; against the plain "float64" entry the project is up to 5.8e-7 off): at most 1e-10, the issue's goal;
  measured at most 4.4e-15 (float64 rounding), 2.7e-15 and 2.4e-15 under the default and AVX2 capabilities.

What is compared:

1. the official ``state_dict`` loads strictly into the project's module tree (``gen_pos_embed`` a persistent
   buffer in both), and the project's RoPE, made on the fly, uses the official frequencies (``rope_inv_freq``);
2. the backbone with the cache, on two left-padded prompts (``NextStep.decode`` with a ``KVCache``): the prompt's
   prefill at its non-pad positions, three single image-token steps, a chunk of three image tokens in one pass
   (a verification's), and all of them in one pass without a cache;
3. the head's velocity ``image_head.net(x, t, c)`` at six times from 0 to 0.96;
4. every transition of ``FlowMatchingHead.sample`` (cfg 1 and 3, timesteps_shift 1 and 2.5, six steps) given the
   recorded noise: the time grid, every state of ``xs`` and the token, through ``FlowChain`` and
   ``run_transitions`` (the official c rows are [cond; uncond], the head's conditions as they are: ``sample``
   applies no ``image_out_projector``);
5. five whole 3 x 3 token grids of ``NextStepPipeline.decoding`` (constant and linear CFG, ``use_norm``,
   timesteps_shift 3, ``gen_pos_embed``, no guidance), replayed through the family's own methods (prompts from
   text by ``check_conditions``, ``plan``, ``start``, ``predict`` per token, the chain run on the recorded draws):
   each token's head conditions, every state of its chain, and the grid (layer-normed where ``use_norm``: the
   canvas holds the head's tokens, the official pipeline the normed ones).
"""

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from csd.config import SamplingConfig
from csd.core.chain import ChainNoise, HeadCondition, run_transitions
from csd.models.nextstep import FlowChain, KVCache, NextStep, NextStepConfig, cfg_scales, token_norm
from csd.models.nextstep.network import rope

REF = torch.load(Path(__file__).parents[1] / "data" / "nextstep_reference.pt", weights_only=True)
# the project's precision: (the reference entry it is compared with, its dtype, the bound on the relative error)
RUNS = {"float32": ("float32", torch.float32, 1e-5), "float64": ("float64_exact", torch.float64, 1e-10)}
PRECISIONS = list(RUNS)
pytestmark = pytest.mark.kernels  # rerun under other kernels (tests/repository/test_perturbations.py)

# The official config's fields the project's NextStepConfig takes as they are.
FIELDS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
    "boi",
    "eoi",
    "image_placeholder_id",
    "head_dim",
    "rms_norm_eps",
    "rope_theta",
    "attention_bias",
    "o_attention_bias",
    "mlp_bias",
    "max_position_embeddings",
    "tie_word_embeddings",
    "latent_size",
    "latent_patch_size",
    "latent_channels",
    "fm_head_dim",
    "fm_head_layers",
    "use_gen_pos_embed",
)


class IdTokenizer:
    """A stand-in tokenizer: a caption is its ids written out ("23 30 59"); the reference's 64 ids, padding
    with id 63 (the official config's pad_token_id)."""

    pad_token_id = REF["float32"]["config"]["pad_token_id"]

    def __len__(self) -> int:
        return REF["float32"]["config"]["vocab_size"]

    def encode(self, text: str) -> list[int]:
        return [int(w) for w in text.split()]

    def to_dict(self) -> dict:
        return {"kind": "ids"}


def caption(ids: torch.Tensor, valid: torch.Tensor) -> str:
    """The caption of a recorded prompt row: its ids but the padding and the begin-of-image id."""
    row = ids[valid.bool()].tolist()
    assert row[-1] == REF["float32"]["config"]["boi"]
    return " ".join(str(i) for i in row[:-1])


DECODE_IDS = REF["float32"]["decode"]["cfg3_constant_shift1"]  # rows [p1, p2, null, null]
CAPTIONS = [caption(DECODE_IDS["input_ids"][i], DECODE_IDS["attention_mask"][i]) for i in range(2)]
NULL_PROMPT = caption(DECODE_IDS["input_ids"][2], DECODE_IDS["attention_mask"][2])


def project_config(recorded: dict, **changes) -> NextStepConfig:
    """The project's config of the recorded official one: its fields, the 3 x 3 grid its latents make, the
    reference's null prompt; ``changes``: a decoding run's sampler settings."""
    assert recorded["hidden_act"] == "silu" and recorded["attention_dropout"] == 0.0
    assert recorded["rope_scaling_is_none"] and recorded["attn_implementation"] == "sdpa"
    side = recorded["latent_size"] // recorded["latent_patch_size"]
    config = NextStepConfig(**{k: recorded[k] for k in FIELDS}, grid_side=side, null_prompt=NULL_PROMPT)
    assert config.token_dim == recorded["token_dim"] and config.seq_len == 9
    return replace(config, **changes)


def project_model(precision: str, **changes) -> NextStep:
    """The project's model with the reference's weights, loaded strictly, in the run's dtype."""
    rec, dtype, _ = RUNS[precision]
    stored = REF[rec]
    model = NextStep(project_config(stored["config"], **changes), IdTokenizer()).to(dtype).eval()
    model.load_state_dict(stored["state_dict"], strict=True)
    return model


@pytest.fixture(scope="module")
def models() -> dict[str, NextStep]:
    return {p: project_model(p) for p in PRECISIONS}


def reference(precision: str) -> dict:
    return REF[RUNS[precision][0]]


def relative(got: torch.Tensor, want: torch.Tensor, where: torch.Tensor | None = None) -> float:
    """The relative error max |got - want| / max |want|, over the entries ``where`` (bool, broadcast over the
    last dimension) selects, or all."""
    got, want = got.double(), want.double()
    if where is not None:
        got, want = got[where.bool()], want[where.bool()]
    assert got.shape == want.shape and want.numel() > 0
    return ((got - want).abs().max() / want.abs().max()).item()


def assert_within(errors: dict[str, float], precision: str) -> None:
    bound = RUNS[precision][2]
    assert max(errors.values()) <= bound, f"relative errors over {bound:.0e}: {errors}"


# --- the comparisons (each returns its relative errors by name) ---------------------------------------------------


def backbone_errors(model: NextStep, rec: dict) -> dict[str, float]:
    """The decoder's final hidden states (after the last RMSNorm) with the cache: the prompt's prefill (at the
    non-pad positions: a pad query reads no key officially, itself in the project), three single-token steps
    and a three-token chunk, against the official StaticCache run; and every position in one pass without a
    cache."""
    bb, dtype = rec["backbone"], model.dtype
    ids, valid = bb["input_ids"], bb["attention_mask"].bool()
    b, width = ids.shape
    steps_in = model.image_in_projector(bb["step_tokens"].to(dtype))  # (2, 3, width) each
    chunk_in = model.image_in_projector(bb["chunk_tokens"].to(dtype))
    cache = KVCache.empty(model.config, b, width + 6, "cpu", dtype)
    cache.valid[:, :width] = valid
    prefill = model.decode(model.embed_tokens(ids), 0, cache)
    steps = torch.cat([model.decode(steps_in[:, k : k + 1], width + k, cache) for k in range(3)], dim=1)
    chunk = model.decode(chunk_in, width + 3, cache)
    all_valid = torch.cat([valid, valid.new_ones(b, 6)], dim=1)
    whole = model.decode(torch.cat([model.embed_tokens(ids), steps_in, chunk_in], dim=1), 0, valid=all_valid)
    static = bb["static"]
    return {
        "prefill": relative(prefill, static["prefill"], valid),
        "steps": relative(steps, static["steps"]),
        "chunk": relative(chunk, static["chunk"]),
        "no cache": relative(whole, bb["no_cache"], all_valid),
    }


def velocity_errors(model: NextStep, rec: dict) -> dict[str, float]:
    v = rec["velocity"]
    return {"velocity": relative(model.image_head.net(v["x"], v["t"], v["c"]), v["out"])}


def sample_errors(model: NextStep, rec: dict, case: str) -> dict[str, float]:
    """One ``FlowMatchingHead.sample`` call: its grid, every state and its token."""
    s, dtype = rec["sample"][case], model.dtype
    assert s["noise_repeat"] == 1 and s["last_step_size"] == 0.04
    c, rows = s["c"], s["noise"].shape[0]
    assert all(torch.equal(d, d[:1].expand_as(d)) for d in (s["noise"], *s["w_cur"]))  # one draw, every row
    if s["cfg"] > 1.0:  # c rows: [cond; uncond]
        cond = HeadCondition(c[:rows], c[rows:], torch.full((rows,), s["cfg"], dtype=dtype))
    else:
        cond = HeadCondition(c)
    chain = FlowChain(model.image_head.net, s["num_sampling_steps"], s["timesteps_shift"], s["last_step_size"])
    traj = run_transitions(chain, cond, ChainNoise(s["noise"].to(dtype), s["w_cur"].to(dtype)))
    times = torch.tensor(chain.times, dtype=s["timesteps"].dtype)
    return {
        "grid": relative(times, s["timesteps"]),
        "states": relative(traj.states[1:], s["xs"][:-1]),  # xs[k - 1]: what transition k reads
        "token": relative(traj.x, s["token"]),
    }


def decode_errors(precision: str, rec: dict, case: str) -> dict[str, float]:
    """One ``NextStepPipeline.decoding`` run replayed by the family: each token's chain from ``predict`` (the
    cache's passes, ``head_conditions``), run on that token's recorded draws."""
    d = rec["decode"][case]
    model = project_model(
        precision,
        use_norm=d["use_norm"],
        use_gen_pos_embed=d["use_gen_pos_embed"],
        timesteps_shift=d["timesteps_shift"],
        num_sampling_steps=d["num_sampling_steps"],
        last_step_size=d["last_step_size"],
        cfg=d["cfg"],
    )
    n, dtype = model.seq_len, model.dtype
    assert d["max_new_len"] == n and cfg_scales(d["cfg"], d["cfg_schedule"], n) == d["cfg_iter"]
    config = SamplingConfig(num_steps=n, cfg_scale=d["cfg"], cfg_schedule=d["cfg_schedule"], precision=precision)
    prompts = model.check_conditions(CAPTIONS, 2, torch.device("cpu"))
    ids, valid = prompts.batch(config.guided)  # the official rows: [p1, p2] (+ [null, null] when guided)
    assert torch.equal(ids, d["input_ids"]) and torch.equal(valid, d["attention_mask"].bool())
    plan = model.plan([0, 1], config, torch.device("cpu"))
    assert plan.cfg == d["cfg_iter"] and plan.sizes == [1] * n
    state = model.start(prompts, config)
    tokens = torch.zeros(2, n, model.token_dim, dtype=dtype)
    mask = torch.ones(2, n, dtype=torch.bool)
    errors = {"conditions": 0.0, "states": 0.0}
    for s in range(n):
        pos = plan.positions(s)
        assert pos.tolist() == [[s], [s]]
        cfg = torch.full((2,), plan.cfg[s], dtype=dtype)
        chain = model.predict(state, tokens, mask, pos, cfg, d["num_sampling_steps"], known=s)
        z = chain.cond.z if chain.cond.z_uncond is None else torch.cat([chain.cond.z, chain.cond.z_uncond])
        draws = d["draws"][s].to(dtype)  # [noise, w_cur...], (steps, 2, token_dim)
        traj = chain.run(ChainNoise(draws[0], draws[1:]))
        tokens[:, s], mask[:, s] = traj.x, False
        errors["conditions"] = max(errors["conditions"], relative(z, d["head_c"][s]))
        errors["states"] = max(errors["states"], relative(torch.cat([traj.states[1:], traj.x[None]]), d["xs"][s]))
    grid = token_norm(tokens) if d["use_norm"] else tokens
    return errors | {"grid": relative(grid, d["tokens"])}


# --- the tests ------------------------------------------------------------------------------------------------------


def test_the_official_state_dict_loads_strictly_into_the_same_module_tree(models):
    for precision, model in models.items():
        stored = reference(precision)
        assert list(model.state_dict()) == list(stored["state_dict"])  # the same names, in the same order
        assert stored["persistent_buffers"] == ["gen_pos_embed"]
        assert [n for n, _ in model.named_buffers()] == ["gen_pos_embed"]
        assert torch.equal(model.gen_pos_embed, stored["state_dict"]["gen_pos_embed"])


@pytest.mark.parametrize("precision", PRECISIONS)
def test_the_rotary_embedding_uses_the_official_frequencies(precision):
    """The official ``rotary_emb.inv_freq`` (not saved; float32, or float64 where the reference lifted the
    casts): the project's cos and sin at every position are those of the recorded frequencies, bit for bit."""
    stored, dtype = reference(precision), RUNS[precision][1]
    inv_freq = stored["rope_inv_freq"]
    assert inv_freq.dtype == dtype
    positions = torch.arange(32)
    cos, sin = rope(positions, 16, stored["config"]["rope_theta"], dtype)
    angles = positions.to(dtype)[:, None] * inv_freq[None]
    angles = torch.cat([angles, angles], dim=-1)
    assert torch.equal(cos, angles.cos()) and torch.equal(sin, angles.sin())


@pytest.mark.parametrize("precision", PRECISIONS)
@torch.no_grad()
def test_the_backbone_with_its_cache_matches_the_official_one(models, precision):
    assert_within(backbone_errors(models[precision], reference(precision)), precision)


@pytest.mark.parametrize("precision", PRECISIONS)
@torch.no_grad()
def test_the_head_velocity_matches_the_official_one(models, precision):
    assert_within(velocity_errors(models[precision], reference(precision)), precision)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("case", list(REF["float32"]["sample"]))
@torch.no_grad()
def test_every_transition_of_the_flow_sampler_matches_the_official_one(models, precision, case):
    assert_within(sample_errors(models[precision], reference(precision), case), precision)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("case", list(REF["float32"]["decode"]))
@torch.no_grad()
def test_a_whole_token_grid_replays_the_official_decoding(precision, case):
    assert_within(decode_errors(precision, reference(precision), case), precision)
