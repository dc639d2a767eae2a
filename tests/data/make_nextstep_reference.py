"""Regenerate (or re-check) tests/data/nextstep_reference.pt from the official NextStep-1 code
(stepfun-ai/NextStep-1, recorded at commit 6e49baeb00d288da296615514dfb343c1af2efb9).

Usage. The official modules need transformers 4.49.0 (the pin in its pyproject; under the project's
transformers 5.x they do not import: ``transformers.modeling_attn_mask_utils`` is gone), so run it in a
venv beside this project's torch, never in the global site-packages:

    python -m venv --system-site-packages /tmp/ns-venv
    /tmp/ns-venv/bin/pip install transformers==4.49.0      # brings tokenizers 0.21, huggingface-hub 0.36
    /tmp/ns-venv/bin/python tests/data/make_nextstep_reference.py /path/to/NextStep-1            # write
    /tmp/ns-venv/bin/python tests/data/make_nextstep_reference.py /path/to/NextStep-1 --verify   # re-check

The path is a checkout of the official repository (its ``nextstep/`` package is imported), kept outside
this repository. Nothing in it is edited. Stand-ins in ``sys.modules``: ``nextstep.utils.*`` (a silent
logger, ``smart_compile`` as the identity so nothing is torch.compiled, ``LargeInt`` as int), torchvision,
diffusers and the Flux VAE module (imported by the pipeline, never called). The noise is intercepted by
wrapping the head module's ``randn_tensor`` (it still draws from the seeded global torch RNG); each
``FlowMatchingHead.sample`` call is watched with ``sys.setprofile`` to read its arguments and its list
``xs``; the head network's calls are watched with a forward hook.

The model is the official ``NextStep`` class from ``NextStepConfig`` at a tiny width (hidden 64, 2 layers,
4 heads, 2 KV heads so GQA, head_dim 16, intermediate 128, vocab 64, attention_bias True with
o_attention_bias False, mlp_bias False, rope_theta 1e4, rms_norm_eps 1e-6, SDPA attention, the default
that transformers 4.49 picks), latent_channels 4 and latent_patch_size 2 (token_dim 16), latent_size 6
(a 3 x 3 token grid), fm_head_dim 32, fm_head_layers 2. Every parameter is redrawn from a seeded
generator (norm scales 1 + 0.1 N(0, 1), everything else 0.1 N(0, 1)), so the layers the official init
zeroes (the head's adaLN modulations, its final layer, all biases) are not zero. The float64 model is the
float32 one cast (identical weights); all inputs are drawn in float32 and cast.

Recorded, per dtype ("float32", "float64"): the config as a plain dict; the official ``state_dict()``
(its key names; ``gen_pos_embed`` is a persistent buffer in it, the rotary ``inv_freq`` is not, and is
stored beside it); the backbone on a left-padded batch of two prompts with the cache (prefill, three
single image-token steps, one chunk of three image tokens), with StaticCache and DynamicCache and without
a cache; the head network's velocity; every transition of ``FlowMatchingHead.sample`` (noise, each
w_cur, each state of ``xs``, each network call) for cfg 1 and 3 at timesteps_shift 1 and 2.5; and five
whole 3 x 3 grids from the official ``NextStepPipeline.decoding`` (called on a pipeline object that has
only ``model``), with every noise tensor drawn. ``notes`` in the file states the conventions.

Recorded a third time, as "float64_exact": the float64 model and inputs run through the same official code
with only its float32 casts lifted, so that every part computes in float64 as the project's float64 runs do
(``notes['float32_casts']`` lists where the official float64 path rounds to float32; the project runs a float64
model in float64 throughout, so against the "float64" entry it differs by float32 rounding, up to 6e-7, not by
float64 rounding). The lifting is done from this script, in memory, the checkout untouched: each function below
is recompiled from its own source (``inspect.getsource``) with the listed text replaced, every replacement
asserted to occur exactly the listed number of times (``LIFTED`` holds them; the file records them):

* ``modeling_llama.LlamaRMSNorm.forward``: ``hidden_states.to(torch.float32)`` becomes
  ``hidden_states.to(torch.promote_types(input_dtype, torch.float32))``: the norm computes in float64 for a
  float64 input (in float32 for float32 and narrower, as before);
* ``modeling_llama.LlamaRotaryEmbedding.forward``: its four ``.float()`` become
  ``.to(torch.promote_types(x.dtype, torch.float32))``: cos/sin from float64 angles; and the model's
  ``rotary_emb.inv_freq`` buffer (not saved) is remade by transformers' ``_compute_default_rope_parameters``
  with its ``.float()`` as ``.double()``: the frequencies in float64 (recorded as ``rope_inv_freq``);
* ``modeling_fm_head.FlowMatchingHead.sample``: ``torch.linspace(t0, t1, num_sampling_steps)`` gets
  ``dtype=c.dtype`` (the time grid in float64, as ``csd.models.nextstep.flow_grid`` makes it); both
  ``randn_tensor(...)`` calls get ``.to(c.dtype)`` (the same float32 draws from the same RNG, cast: the
  recorded ``noise``/``w_cur``/``draws`` stay the float32 draws, and the SDE state ``x``, hence ``xs``, is
  float64); both ``velocity.to(torch.float32)`` become ``velocity.to(c.dtype)`` (the velocity, the CFG mix,
  the score and the drift in float64);
* ``modeling_fm_head.TimestepEmbedder.timestep_embedding`` (a staticmethod): its frequencies'
  ``torch.arange(..., dtype=torch.float32)`` and ``t[:, None].float()`` take
  ``torch.promote_types(t.dtype, torch.float32)``: the sinusoid of a float64 t in float64, as the project's
  NextStep head makes it (``csd.models.nextstep.network.WideTimestepEmbedder``). Kept in float32, the float64
  comparison would hold at 1e-15 on the CPU that made the file only: float32 cos/sin round differently under
  other vector kernels (AVX2, or none, against AVX-512: 1e-9 of the velocity).

The weights (``gen_pos_embed`` included: a float32 table in both codes) are the float64 entry's, shared with it
in the file. SDPA already runs in the model dtype. So "float64_exact" differs from "float64" by the float32
roundings alone.

``--verify`` loads the file with ``weights_only=True``, rebuilds the official model from each stored
config and state dict, re-runs everything from the stored inputs and seeds and checks each output is
bit-identical; replays the decoding runs from the stored noise alone (the RNG replaced); and prints the
float32-vs-float64, float64-vs-float64_exact and SDPA-vs-eager differences.
"""
import contextlib
import inspect
import sys
import textwrap
import types

import torch
import transformers  # before the stand-ins: it probes installed packages (torchvision among them)
from torch import nn
from transformers import modeling_rope_utils
from transformers.cache_utils import DynamicCache, StaticCache


def _stub(name, **attrs):
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return module


class _SilentLogger:
    def __getattr__(self, name):
        return lambda *args, **kwargs: None


_stub("nextstep.utils.loguru", logger=_SilentLogger())
_stub("nextstep.utils.compile_utils", smart_compile=lambda *args, **kwargs: (lambda f: f),
      compile_manager=types.SimpleNamespace(compile_disabled=contextlib.nullcontext))
_stub("nextstep.utils.misc", LargeInt=int)
_stub("nextstep.utils.optim_utils", ALL_LAYERNORM_LAYERS=[nn.LayerNorm])
_stub("nextstep.utils.image_utils", ImageType=object, center_crop_arr=None, load_image=None, to_pil=None)
_stub("nextstep.utils.training_utils", set_seed=None)
_AutoencoderKL = type("AutoencoderKL", (), {})  # only annotations use it
_stub("nextstep.models.modeling_flux_vae", AutoencoderKL=_AutoencoderKL)
_stub("diffusers", AutoencoderKL=_AutoencoderKL)
_stub("torchvision", transforms=_stub("torchvision.transforms"))

CHECKOUT = sys.argv[1]
VERIFY = "--verify" in sys.argv[2:]
sys.path.insert(0, CHECKOUT)

import nextstep.models.modeling_fm_head as fm_module  # noqa: E402
import nextstep.models.modeling_llama as llama_module  # noqa: E402
from nextstep.models.configuration_nextstep import NextStepConfig  # noqa: E402
from nextstep.models.modeling_fm_head import FlowMatchingHead  # noqa: E402
from nextstep.models.modeling_nextstep import NextStep  # noqa: E402
from nextstep.models.pipeline_nextstep import NextStepPipeline  # noqa: E402

OUT = __file__.replace("make_nextstep_reference.py", "nextstep_reference.pt")
OFFICIAL_COMMIT = "6e49baeb00d288da296615514dfb343c1af2efb9"
SEED = 5150  # the generator for the weights and every input
CONFIG = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, vocab_size=64, rms_norm_eps=1e-6, rope_theta=10000.0, attention_bias=True,
              o_attention_bias=False, mlp_bias=False, hidden_act="silu", max_position_embeddings=128,
              tie_word_embeddings=False, attention_dropout=0.0, initializer_range=0.02, latent_size=6,
              latent_patch_size=2, latent_channels=4, boi=60, eoi=61, image_placeholder_id=62, pad_token_id=63,
              fm_head_dim=32, fm_head_layers=2, fm_head_batch_mul=4, use_gen_pos_embed=False,
              attn_implementation="sdpa")
TOKEN_DIM = CONFIG["latent_channels"] * CONFIG["latent_patch_size"] ** 2
GRID = (CONFIG["latent_size"] // CONFIG["latent_patch_size"]) ** 2  # 9 tokens
SAMPLE_CASES = [("cfg1_shift1", 1.0, 1.0), ("cfg1_shift2.5", 1.0, 2.5), ("cfg3_shift1", 3.0, 1.0),
                ("cfg3_shift2.5", 3.0, 2.5)]
DECODE_CASES = [  # name, cfg, cfg_schedule, use_norm, timesteps_shift, use_gen_pos_embed
    ("cfg3_constant_shift1", 3.0, "constant", False, 1.0, False),
    ("cfg3_linear_norm_shift3", 3.0, "linear", True, 3.0, False),
    ("cfg3_constant_norm_shift3_pos", 3.0, "constant", True, 3.0, True),
    ("cfg3_linear_shift1_pos", 3.0, "linear", False, 1.0, True),
    ("cfg1_constant_shift1", 1.0, "constant", False, 1.0, False),
]
NUM_STEPS, LAST_STEP = 6, 0.04
VARIANTS = [("float32", torch.float32, False), ("float64", torch.float64, False), ("float64_exact", torch.float64, True)]

NOTES = {
    "time": "t=0 is noise, t=1 is data: x_t = t * x1 + (1 - t) * noise, the network predicts v = x1 - noise "
            "(FlowMatchingHead.forward). t goes to the network raw, in [0, 1] (not scaled by 1000): "
            "TimestepEmbedder.timestep_embedding(t, 256, max_period 1e4) = cat[cos(t f), sin(t f)], "
            "f_k = exp(-ln(1e4) k / 128), computed in float32 (t.float()) even in float64, then cast to the mlp dtype.",
    "grid": "timesteps = torch.linspace(0, 1 - last_step_size, num_sampling_steps) (float32); then "
            "timesteps = timesteps / (shift - (shift - 1) * timesteps). num_sampling_steps - 1 stochastic steps "
            "from t_i to t_{i+1}, then one deterministic Euler step of length last_step_size from t_{N-1}; "
            "len(xs) == num_sampling_steps. With shift != 1 the last step does NOT end at t = 1 "
            "(shift 2.5: t_{N-1} = 0.96 / 1.06 = 0.9057, + 0.04).",
    "sde_step": "for each (ti, tj): v = velocity (see cfg) in float32; "
                "score = (t * v - x) / ((1 - t)**2 - t * (-1) * (1 - t)); drift = v + (1 - t) * score; "
                "w_cur = randn_tensor(...); dw = w_cur * sqrt(dt), dt = tj - ti; "
                "x = (x + drift * dt) + sqrt(2 * (1 - t)) * dw; xs.append(x). Final: "
                "x = xs[-1] + v(xs[-1], t_{N-1}) * last_step_size; returned as xs[-1].to(c.dtype).",
    "state_dtype": "The noise is drawn in float32 (randn_tensor's default dtype) whatever the model dtype, and the "
                   "sampler state x stays float32: the network gets x.to(c.dtype) and t.to(c) and its output is cast "
                   "back with .to(torch.float32) before the cfg mix. Only the returned token is cast to c.dtype. "
                   "So in the float64 model the whole SDE (and the cfg mix) runs in float32.",
    "noise": "randn_tensor((rows, token_dim), noise_repeat) = torch.randn((noise_repeat, token_dim)).repeat("
             "rows // noise_repeat, 1), rows = c.shape[0] // cfg_mult (the cond rows only). noise_repeat = 1 here "
             "(the pipeline passes num_images_per_caption = 1), so ONE row is drawn and every batch row gets the "
             "same noise and the same w_cur. Per sample call: 1 initial noise then num_sampling_steps - 1 w_cur, "
             "none for the final Euler step. The recorded draws are the repeated (rows, token_dim) tensors, in "
             "draw order, from the global CPU RNG seeded with torch.manual_seed(seed) right before the run.",
    "cfg": "cfg_mult = 1 + (cfg > 1) + (cfg2 > 1); rows of c are [cond rows; uncond rows] (cfg 3 with two prompts: "
           "[p1, p2, null, null]); the network sees cat([x] * cfg_mult) and v = v_u + cfg * (v_c - v_u) with "
           "(v_c, v_u) = chunk(v.float(), 2). cfg2 (image cfg) stays 1.0 here.",
    "cfg_schedule": "constant: cfg_iter = cfg. linear (pipeline.decoding, 'follow Muse'): cfg_iter = 1 + (cfg - 1) * "
                    "(N - k) / N where N = max_new_len and k = tokens generated so far (k = 0 for the first token), "
                    "so it goes from cfg down to 1 + (cfg - 1) / N and never reaches 1 (cfg_mult stays 2).",
    "use_norm": "pipeline.decoding with use_norm: token = F.layer_norm(token, token.size()[1:], None, None, 1e-6), "
                "over the token_dim of each sampled token, no affine, applied before the token is stored and fed "
                "back.",
    "decoding": "pipeline.decoding order per step k: c = model.image_out_projector(c); token = image_head.sample("
                "c.squeeze(1), cfg=cfg_iter, cfg2=1, timesteps_shift, num_sampling_steps, noise_repeat=1) with the "
                "default last_step_size 0.04; optional layer_norm; e = image_in_projector(token) duplicated for the "
                "uncond rows (cat([e, e])); attention_mask gets a column of ones; forward_model(inputs_embeds=e, "
                "attention_mask, past_key_values, use_cache=True) with NO cache_position; c = last_hidden_state[:, "
                "-1:] (+ gen_pos_embed[:, k + 1] if use_gen_pos_embed). The prefill c (before decoding) is "
                "last_hidden_state[:, -1:] (+ gen_pos_embed[:, 0]). gen_pos_embed is added BEFORE image_out_projector.",
    "positions": "forward_model: cache_position = arange(past, past + seq) where past = cache.get_seq_length() when "
                 "not given (StaticCache counts the non-zero key rows of batch row 0, head 0, layer 0); "
                 "position_ids = cache_position.unsqueeze(0), the same for every row: under left padding the pad "
                 "positions count (a row with 3 pads starts its text at RoPE position 3). The 2-D attention mask "
                 "(1 = token, 0 = pad, growing by ones per new token) becomes an additive 4-D causal mask "
                 "(finfo.min where masked); pad keys are masked for every query.",
    "hidden_states": "last_hidden_state is after the final RMSNorm and before image_out_projector. Hidden states at "
                     "pad positions (attention_mask 0) are meaningless (their query sees no key): compare only "
                     "where attention_mask is 1.",
    "float32_casts": "The official float64 path is float32-limited in places: LlamaRMSNorm computes in float32 and "
                     "casts back; RoPE cos/sin are computed in float32 and cast; the time embedding is float32; the "
                     "SDE state is float32 (see state_dtype). SDPA itself runs in the model dtype.",
    "float64_exact": "The entry 'float64_exact' is the float64 model run with those float32 casts lifted (its "
                     "'lifted' lists the source edits, made in memory by the script): RMSNorm, RoPE (inv_freq "
                     "too) and the sampler's grid, state, velocity and CFG mix in float64; the noise is the same "
                     "float32 draws cast to float64 (recorded as the float32 draws); the time embedding's sinusoid "
                     "(t and its frequencies) in float64. Still float32 there: the gen_pos_embed table (a float32 "
                     "table in the state dict). Its state_dict is the float64 entry's (the same tensors).",
    "gen_pos_embed": "state_dict['gen_pos_embed'] is a persistent buffer (1, 1024, hidden): get_2d_sincos_pos_embed("
                     "hidden, 32), a fixed 32 x 32 MAE sin-cos table (numpy float64, then .float(), then the model "
                     "dtype). Row m = [sin(w o), cos(w o), sin(h o), cos(h o)] with w = m % 32, h = m // 32, "
                     "o_k = 1e4 ** (-k / (hidden / 4)), k < hidden / 4. Decoding indexes it by the linear step "
                     "(token k's condition gets row k), NOT by the token's (row, col) on the actual grid: on a 3 x 3 "
                     "grid token 3 gets table row 3 = (h 0, w 3).",
    "attention": "SDPA (config attn_implementation 'sdpa', the transformers 4.49 default for this class). Eager gives "
                 "the same numbers to ~2e-6 in float32 but NaN in float64 under left padding: its softmax runs in "
                 "float32, float64's finfo.min becomes -inf, the fully masked pad rows give NaN, and those NaN values "
                 "reach every later position through the pad positions' cached values (0 * NaN).",
    "cache": "backbone[...]['static'] uses StaticCache(config, max_batch_size=B, max_cache_len=L + 6, dtype) as the "
             "pipeline does; ['dynamic'] uses DynamicCache; cache_position is never passed. 'steps' stacks the three "
             "single-token outputs along dim 1; 'chunk' is the 3-token chunk (every position, as a speculative "
             "verification sees it); 'no_cache' is one pass over prompt + step tokens + chunk tokens.",
}


def build(config):
    kwargs = {k: v for k, v in config.items() if k not in ("token_dim", "rope_scaling_is_none")}
    torch.manual_seed(0)  # the official init draws from the global RNG; every parameter is overwritten
    return NextStep(NextStepConfig(**kwargs)).eval()


# ---- float64 without the official float32 casts (the "float64_exact" entry; see the module doc) ------------------
def recompiled(func, edits):
    """``func`` (its undecorated function) made again from its own source with each (old, new, count) of
    ``edits`` replaced, every ``old`` asserted to occur exactly ``count`` times; its decorators applied again."""
    raw = inspect.unwrap(func.__func__ if isinstance(func, staticmethod) else func)
    source = textwrap.dedent(inspect.getsource(raw))
    for old, new, count in edits:
        assert source.count(old) == count, (raw.__qualname__, old, source.count(old))
        source = source.replace(old, new)
    namespace = {}
    exec(compile(source, f"<{raw.__qualname__}, float32 casts lifted>", "exec"), raw.__globals__, namespace)
    made = namespace[raw.__name__]
    assert isinstance(made, staticmethod) == isinstance(func, staticmethod)
    return made


_WIDE_T = "torch.promote_types(t.dtype, torch.float32)"
_RANDN = "randn_tensor((c.shape[0] // cfg_mult, self.input_dim), noise_repeat, self.device)"
LIFTED = {  # (owner, attribute): the text edits; see the module doc
    (llama_module.LlamaRMSNorm, "forward"): [
        ("hidden_states.to(torch.float32)", "hidden_states.to(torch.promote_types(input_dtype, torch.float32))", 1)],
    (llama_module.LlamaRotaryEmbedding, "forward"): [
        (".float()", ".to(torch.promote_types(x.dtype, torch.float32))", 4)],
    (FlowMatchingHead, "sample"): [
        ("torch.linspace(t0, t1, num_sampling_steps)", "torch.linspace(t0, t1, num_sampling_steps, dtype=c.dtype)", 1),
        (_RANDN, _RANDN + ".to(c.dtype)", 2),
        ("velocity.to(torch.float32)", "velocity.to(c.dtype)", 2)],
    (fm_module.TimestepEmbedder, "timestep_embedding"): [
        ("torch.arange(start=0, end=half, dtype=torch.float32)", f"torch.arange(start=0, end=half, dtype={_WIDE_T})", 1),
        ("t[:, None].float()", f"t[:, None].to({_WIDE_T})", 1)],
    (modeling_rope_utils, "_compute_default_rope_parameters"): [(".float()", ".double()", 1)],
}
_LIFTED_FUNCS = {key: recompiled(inspect.getattr_static(*key), edits) for key, edits in LIFTED.items()}


@contextlib.contextmanager
def float32_casts_lifted():
    """The official classes with the recompiled methods while inside."""
    saved = {key: inspect.getattr_static(*key) for key in _LIFTED_FUNCS}
    for (owner, name), func in _LIFTED_FUNCS.items():
        setattr(owner, name, func)
    try:
        yield
    finally:
        for (owner, name), func in saved.items():
            setattr(owner, name, func)


def lift_rope(model):
    """The model's rotary frequencies (a buffer made at construction, not saved) remade in float64."""
    inv_freq, _ = _LIFTED_FUNCS[(modeling_rope_utils, "_compute_default_rope_parameters")](model.config, "cpu")
    assert inv_freq.dtype == torch.float64
    assert torch.allclose(inv_freq, model.rotary_emb.inv_freq.double(), rtol=1e-7, atol=0)
    model.rotary_emb.inv_freq = inv_freq
    return model


def lifted_notes():
    return [f"{owner.__name__}.{name}: {old!r} -> {new!r} (x{count})" for (owner, name), edits in LIFTED.items()
            for old, new, count in edits]


def randomise(model, g):
    with torch.no_grad():
        for name, p in model.named_parameters():
            base = 1.0 if name.endswith("norm.weight") or name.endswith("in_ln.weight") else 0.0
            p.copy_(base + torch.randn(p.shape, generator=g) * 0.1)


def make_inputs(g):
    """Every input, drawn in float32 (ids as int64)."""
    def prompt(n):
        return torch.randint(0, 60, (n - 1,), generator=g).tolist() + [CONFIG["boi"]]

    rows = [prompt(4), prompt(7), prompt(3)]  # p1 (left-padded), p2 (full width), the null prompt
    width = max(len(r) for r in rows)
    ids = torch.full((3, width), CONFIG["pad_token_id"])
    mask = torch.zeros(3, width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r)
        mask[i, width - len(r):] = 1
    hidden = CONFIG["hidden_size"]
    return {
        "backbone": {"input_ids": ids[:2], "attention_mask": mask[:2],
                     "step_tokens": torch.randn(2, 3, TOKEN_DIM, generator=g),
                     "chunk_tokens": torch.randn(2, 3, TOKEN_DIM, generator=g)},
        "velocity": {"x": torch.randn(6, TOKEN_DIM, generator=g),
                     "t": torch.tensor([0.0, 0.1, 0.25, 0.5, 0.9, 0.96]),
                     "c": torch.randn(6, hidden, generator=g)},
        "sample_c": torch.randn(4, hidden, generator=g),  # [cond1, cond2, uncond1, uncond2]
        "decode": {"input_ids": ids[[0, 1, 2, 2]], "attention_mask": mask[[0, 1, 2, 2]]},
    }


# ---- watching the official sampler -------------------------------------------------------------------------------
SAMPLE_CODES = {inspect.unwrap(FlowMatchingHead.sample).__code__,
                inspect.unwrap(_LIFTED_FUNCS[(FlowMatchingHead, "sample")]).__code__}
_real_randn_tensor = fm_module.randn_tensor
DRAWS, SAMPLE_CALLS, NET_CALLS, REPLAY = [], [], [], []


def randn_tensor(shape, noise_repeat, device, dtype=torch.float32):
    if REPLAY:  # verify: the recorded draw, no RNG
        out = REPLAY.pop(0)
        assert tuple(out.shape) == tuple(shape) and out.dtype == dtype
    else:
        out = _real_randn_tensor(shape, noise_repeat, device, dtype)
    DRAWS.append(out.clone())
    return out


fm_module.randn_tensor = randn_tensor


def _profile(frame, event, arg):
    if frame.f_code in SAMPLE_CODES:
        if event == "call":
            f = frame.f_locals
            SAMPLE_CALLS.append({"c": f["c"].clone(), "cfg": float(f["cfg"]), "cfg2": float(f["cfg2"]),
                                 "timesteps_shift": float(f["timesteps_shift"]),
                                 "num_sampling_steps": int(f["num_sampling_steps"]),
                                 "last_step_size": float(f["last_step_size"]), "noise_repeat": int(f["noise_repeat"])})
        elif event == "return":
            SAMPLE_CALLS[-1]["xs"] = torch.stack([x.clone() for x in frame.f_locals["xs"]])


def _net_hook(module, args, output):
    NET_CALLS.append((args[0].clone(), args[1].clone(), output.clone()))


@contextlib.contextmanager
def watching(model):
    DRAWS.clear(), SAMPLE_CALLS.clear(), NET_CALLS.clear()
    handle = model.image_head.net.register_forward_hook(_net_hook)
    sys.setprofile(_profile)
    try:
        yield
    finally:
        sys.setprofile(None)
        handle.remove()


# ---- the runs ------------------------------------------------------------------------------------------------------
def run_backbone(model, inp, dtype, kind):
    ids, mask = inp["input_ids"], inp["attention_mask"]
    bsz, width = ids.shape
    if kind == "static":
        cache = StaticCache(config=model.config, max_batch_size=bsz, max_cache_len=width + 6, device="cpu", dtype=dtype)
    else:
        cache = DynamicCache()
    out = model.forward_model(inputs_embeds=model.prepare_inputs_embeds(ids), attention_mask=mask,
                              past_key_values=cache, use_cache=True)
    rec = {"prefill": out.last_hidden_state}
    steps = []
    for k in range(3):
        mask = torch.cat([mask, mask.new_ones(bsz, 1)], dim=1)
        out = model.forward_model(inputs_embeds=model.image_in_projector(inp["step_tokens"][:, k:k + 1].to(dtype)),
                                  attention_mask=mask, past_key_values=out.past_key_values, use_cache=True)
        steps.append(out.last_hidden_state)
    rec["steps"] = torch.cat(steps, dim=1)
    mask = torch.cat([mask, mask.new_ones(bsz, 3)], dim=1)
    out = model.forward_model(inputs_embeds=model.image_in_projector(inp["chunk_tokens"].to(dtype)),
                              attention_mask=mask, past_key_values=out.past_key_values, use_cache=True)
    rec["chunk"] = out.last_hidden_state
    return rec


def run_sample(model, c, cfg, shift, seed):
    torch.manual_seed(seed)
    with watching(model):
        token = model.image_head.sample(c=c, cfg=cfg, timesteps_shift=shift, num_sampling_steps=NUM_STEPS,
                                        last_step_size=LAST_STEP)
    call = SAMPLE_CALLS[0]
    assert len(SAMPLE_CALLS) == 1 and len(DRAWS) == NUM_STEPS and len(NET_CALLS) == NUM_STEPS
    lifted = inspect.getattr_static(FlowMatchingHead, "sample") is _LIFTED_FUNCS[(FlowMatchingHead, "sample")]
    grid = torch.linspace(0, 1 - LAST_STEP, NUM_STEPS, dtype=c.dtype if lifted else torch.float32)
    grid = grid / (shift - (shift - 1) * grid)
    rows = DRAWS[0].shape[0]
    assert torch.equal(torch.stack([t[0] for _, t, _ in NET_CALLS]), grid.to(c))  # the grid the network saw
    states = [DRAWS[0], *call["xs"][:-1]]  # the state each network call saw: the noise, then xs
    assert all(torch.equal(x[:rows], s.to(c)) for (x, _, _), s in zip(NET_CALLS, states, strict=True))
    return {"seed": seed, "c": c, "cfg": cfg, "timesteps_shift": shift, "num_sampling_steps": NUM_STEPS,
            "last_step_size": LAST_STEP, "noise_repeat": call["noise_repeat"],
            "timesteps": torch.stack([t[0] for _, t, _ in NET_CALLS]).to(grid.dtype),
            "noise": DRAWS[0], "w_cur": torch.stack(DRAWS[1:]), "xs": call["xs"], "token": token,
            "net_x": torch.stack([x for x, _, _ in NET_CALLS]), "net_out": torch.stack([o for _, _, o in NET_CALLS])}


def run_decode(model, inp, dtype, case, seed):
    name, cfg, schedule, use_norm, shift, use_pos = case
    rows = slice(None) if cfg != 1.0 else slice(0, 2)  # cfg 1: the two prompts, no null rows
    ids, mask = inp["input_ids"][rows], inp["attention_mask"][rows]
    pipe = object.__new__(NextStepPipeline)  # no tokenizer, no VAE: decoding touches only self.model
    pipe.model = model
    model.config.use_gen_pos_embed = use_pos
    try:
        cache = StaticCache(config=model.config, max_batch_size=ids.shape[0], max_cache_len=ids.shape[1] + GRID,
                            device="cpu", dtype=dtype)
        # generate_image steps 5 (prefill) and 6 (decoding), in the official order
        out = model.forward_model(inputs_embeds=model.prepare_inputs_embeds(ids), attention_mask=mask,
                                  past_key_values=cache, use_cache=True)
        c = out.last_hidden_state[:, -1:]
        if model.config.use_gen_pos_embed:
            c = c + model.gen_pos_embed[:, 0:1, :]
        projected = []
        handle = model.image_out_projector.register_forward_hook(lambda m, a, o: projected.append(a[0].clone()))
        torch.manual_seed(seed)
        with watching(model):
            tokens = pipe.decoding(c=c, attention_mask=mask, past_key_values=out.past_key_values, max_new_len=GRID,
                                   num_images_per_caption=1, use_norm=use_norm, cfg=cfg, cfg_img=1.0,
                                   cfg_schedule=schedule, timesteps_shift=shift, num_sampling_steps=NUM_STEPS,
                                   progress=False)
        handle.remove()
    finally:
        model.config.use_gen_pos_embed = False
    assert len(DRAWS) == GRID * NUM_STEPS and len(SAMPLE_CALLS) == GRID
    return {"seed": seed, "cfg": cfg, "cfg_schedule": schedule, "use_norm": use_norm, "timesteps_shift": shift,
            "use_gen_pos_embed": use_pos, "num_sampling_steps": NUM_STEPS, "last_step_size": LAST_STEP,
            "max_new_len": GRID, "input_ids": ids, "attention_mask": mask,
            "cfg_iter": [s["cfg"] for s in SAMPLE_CALLS],
            "hidden": torch.stack([h.squeeze(1) for h in projected]),  # c before image_out_projector, per step
            "head_c": torch.stack([s["c"] for s in SAMPLE_CALLS]),  # what image_head.sample got, per step
            "draws": torch.stack(DRAWS).view(GRID, NUM_STEPS, *DRAWS[0].shape),  # [token][0 noise, 1.. w_cur]
            "xs": torch.stack([s["xs"] for s in SAMPLE_CALLS]),
            "tokens": tokens}


@torch.no_grad()
def run_all(model, inputs, dtype):
    def cast(x):
        return x.to(dtype) if torch.is_tensor(x) and x.is_floating_point() else x

    rec = {"backbone": {k: cast(v) for k, v in inputs["backbone"].items()}}
    for kind in ("static", "dynamic"):
        rec["backbone"][kind] = run_backbone(model, inputs["backbone"], dtype, kind)
    b = inputs["backbone"]
    embeds = torch.cat([model.prepare_inputs_embeds(b["input_ids"]), model.image_in_projector(cast(b["step_tokens"])),
                        model.image_in_projector(cast(b["chunk_tokens"]))], dim=1)
    full_mask = torch.cat([b["attention_mask"], b["attention_mask"].new_ones(2, 6)], dim=1)
    rec["backbone"]["no_cache"] = model.forward_model(inputs_embeds=embeds, attention_mask=full_mask,
                                                      use_cache=False).last_hidden_state
    v = {k: cast(x) for k, x in inputs["velocity"].items()}
    rec["velocity"] = {**v, "out": model.image_head.net(v["x"], v["t"], v["c"])}
    c = cast(inputs["sample_c"])
    rec["sample"] = {name: run_sample(model, c if cfg != 1.0 else c[:2], cfg, shift, 100 + i)
                     for i, (name, cfg, shift) in enumerate(SAMPLE_CASES)}
    rec["decode"] = {case[0]: run_decode(model, inputs["decode"], dtype, case, 200 + i)
                     for i, case in enumerate(DECODE_CASES)}
    return rec


def config_dict(model):
    c = model.config
    out = {k: getattr(c, k) for k in CONFIG if k != "attn_implementation"}
    out["attn_implementation"] = c._attn_implementation
    out["token_dim"] = TOKEN_DIM
    out["rope_scaling_is_none"] = c.rope_scaling is None
    return out


def inputs_of(rec):
    return {"backbone": {k: rec["backbone"][k] for k in ("input_ids", "attention_mask", "step_tokens", "chunk_tokens")},
            "velocity": {k: rec["velocity"][k] for k in ("x", "t", "c")},
            "sample_c": rec["sample"]["cfg3_shift1"]["c"],
            "decode": {k: rec["decode"]["cfg3_constant_shift1"][k] for k in ("input_ids", "attention_mask")}}


def mismatches(a, b, path=""):
    """The paths where the stored a differs from the re-run b (b's keys; a may hold more)."""
    if isinstance(b, dict):
        return sum((mismatches(a[k], b[k], f"{path}/{k}") if k in a else [f"{path}/{k} missing"] for k in b), [])
    if isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [path]
        return sum((mismatches(x, y, f"{path}[{i}]") for i, (x, y) in enumerate(zip(a, b, strict=True))), [])
    if torch.is_tensor(a):
        same = a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    else:
        same = a == b
    return [] if same else [path]


def rel(a, b, mask=None):
    a, b = a.double(), b.double()
    if mask is not None:
        a, b = a[mask.bool()], b[mask.bool()]
    return ((a - b).abs().max() / b.abs().max()).item()


def generate():
    g = torch.Generator().manual_seed(SEED)
    model32 = build(CONFIG)
    randomise(model32, g)
    inputs = make_inputs(g)
    out = {"notes": NOTES, "seed": SEED, "official_commit": OFFICIAL_COMMIT, "transformers": transformers.__version__,
           "torch": str(torch.__version__)}
    for name, dtype, exact in VARIANTS:
        model = model32 if dtype == torch.float32 else build(CONFIG).to(dtype)
        if model is not model32:
            model.load_state_dict(model32.state_dict())  # the same weights, cast up
        if exact:
            lift_rope(model)
        with float32_casts_lifted() if exact else contextlib.nullcontext():
            rec = run_all(model, inputs, dtype)
        real = inputs["backbone"]["attention_mask"].bool()
        for kind in ("prefill", "steps", "chunk"):  # prefill: the real positions only
            diff = rec["backbone"]["static"][kind] - rec["backbone"]["dynamic"][kind]
            diff = diff[real] if kind == "prefill" else diff
            rec["backbone"][f"static_vs_dynamic_max_abs_{kind}"] = diff.abs().max().item()
        state = dict(model.state_dict())
        if exact:  # the float64 entry's weights: the same tensors, stored once in the file
            shared = out["float64"]["state_dict"]
            assert state.keys() == shared.keys() and all(torch.equal(state[k], shared[k]) for k in state)
            state = shared
        out[name] = {"config": config_dict(model), "state_dict": state,
                     "persistent_buffers": [n for n, _ in model.named_buffers() if n in model.state_dict()],
                     "rope_inv_freq": model.rotary_emb.inv_freq.clone(), **rec}
        if exact:
            out[name]["lifted"] = lifted_notes()
    plain(out)
    torch.save(out, OUT)
    print("wrote", OUT)


def plain(x, path=""):
    """Only tensors, dicts with str keys, lists, str, int, float and bool in the file."""
    if isinstance(x, dict):
        assert type(x) is dict and all(isinstance(k, str) for k in x), path
        for k, v in x.items():
            plain(v, f"{path}/{k}")
    elif isinstance(x, list):
        for i, v in enumerate(x):
            plain(v, f"{path}[{i}]")
    else:
        assert torch.is_tensor(x) or type(x) in (str, int, float, bool), (path, type(x))


def verify():
    ref = torch.load(OUT, weights_only=True)
    for name, dtype, exact in VARIANTS:
        stored = ref[name]
        model = build(stored["config"]).to(dtype)
        model.load_state_dict(stored["state_dict"], strict=True)
        if exact:
            lift_rope(model)
            assert stored["lifted"] == lifted_notes()
        assert torch.equal(model.rotary_emb.inv_freq, stored["rope_inv_freq"])
        lifting = float32_casts_lifted if exact else contextlib.nullcontext
        with lifting():
            rec = run_all(model, inputs_of(stored), dtype)
        bad = mismatches({k: stored[k] for k in rec}, rec)
        print(name, "re-run bit-identical:", not bad, bad[:5])
        for case in DECODE_CASES:  # the decoding again from the stored noise only (RNG bypassed)
            d = stored["decode"][case[0]]
            REPLAY[:] = list(d["draws"].flatten(0, 1))
            with lifting():
                replayed = run_decode(model, inputs_of(stored)["decode"], dtype, case, seed=0)
            assert not REPLAY
            print(f"  replay {case[0]}: tokens identical {torch.equal(replayed['tokens'], d['tokens'])}")
        bb = stored["backbone"]
        print("  static vs dynamic max abs:", {k: bb[f"static_vs_dynamic_max_abs_{k}"] for k in ("prefill", "steps",
                                                                                                  "chunk")})
        n = bb["input_ids"].shape[1]
        m = bb["attention_mask"].bool()
        d = ((bb["static"]["prefill"] - bb["no_cache"][:, :n])[m], bb["static"]["steps"] - bb["no_cache"][:, n:n + 3],
             bb["static"]["chunk"] - bb["no_cache"][:, n + 3:])
        print("  cache vs no cache max abs: prefill {:.2e} steps {:.2e} chunk {:.2e}".format(
            *(x.abs().max() for x in d)))
        if exact:  # eager attention NaNs in float64 under left padding (notes["attention"])
            continue
        eager = build({**stored["config"], "attn_implementation": "eager"}).to(dtype)
        eager.load_state_dict(stored["state_dict"])
        assert type(eager.layers[0].self_attn).__name__ == "LlamaAttention"
        assert type(model.layers[0].self_attn).__name__ == "LlamaSdpaAttention"
        with torch.no_grad():
            e = run_backbone(eager, bb, dtype, "static")
        d = ((e["prefill"] - bb["static"]["prefill"])[m], e["steps"] - bb["static"]["steps"],
             e["chunk"] - bb["static"]["chunk"])
        nan = sum(x.isnan().any(-1).sum().item() for x in (e["prefill"][m], e["steps"], e["chunk"]))
        print("  eager vs sdpa max abs: prefill {:.2e} steps {:.2e} chunk {:.2e}; eager rows with NaN at real "
              "positions: {}".format(*(x.abs().max() for x in d), nan))
    for first, second in (("float32", "float64"), ("float64", "float64_exact"), ("float32", "float64_exact")):
        compare(ref[first], ref[second], f"{first} vs {second}, max |diff| / max |{second}|:")


def compare(a, b, title):
    m = a["backbone"]["attention_mask"]
    print(title)
    for k in ("prefill", "steps", "chunk"):
        mm = m if k == "prefill" else None
        print(f"  backbone {k}: {rel(a['backbone']['static'][k], b['backbone']['static'][k], mm):.2e}")
    print(f"  velocity: {rel(a['velocity']['out'], b['velocity']['out']):.2e}")
    for k in a["sample"]:
        print(f"  sample {k}: token {rel(a['sample'][k]['token'], b['sample'][k]['token']):.2e}"
              f"  noise identical {torch.equal(a['sample'][k]['noise'], b['sample'][k]['noise'])}")
    for k in a["decode"]:
        same = torch.equal(a["decode"][k]["draws"], b["decode"][k]["draws"])
        err = rel(a["decode"][k]["tokens"], b["decode"][k]["tokens"])
        print(f"  decode {k}: tokens {err:.2e}  draws identical {same}")


if __name__ == "__main__":
    verify() if VERIFY else generate()
