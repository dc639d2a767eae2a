"""Regenerate tests/data/harmon_reference.pt from the official Harmon code (wusize/Harmon).

Usage (transformers 4.45.2, the official pin, e.g. in a venv next to this project's torch):

    python tests/data/make_harmon_reference.py /path/to/Harmon   # a checkout: its src/ is imported

Nothing is edited in the checkout: timm's Block is replaced by a stand-in with its parameter names
(tests/data/official_stubs.py), mmengine's registry by an identity builder, ``.cuda()`` by a no-op,
and the VAE by the identity (the test compares tokens, not pixels). The model is tiny and random: a
2-layer Qwen2 (eager attention) and the 4x4-grid MAR of the MAR reference. The tokenizer is a stand-in
character tokenizer the test rebuilds (ids = ord(c) % 120 + 2, padding with 1 as the "eos" id).

Recorded: the per-position conditions z for two prompts of different lengths and the null prompt,
fully masked, half and nearly complete, on the model's grid and on a 6x6 grid (position embeddings
resized); the head network's output on those z; and one whole CFG sampling run (4 AR steps) with its
orders fixed and every noise tensor it drew recorded, with the positions predicted at each step.
"""
import sys
import types
from functools import partial

import transformers  # noqa: F401  (before the timm stand-in: it probes installed packages)

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from official_stubs import install_timm_block  # noqa: E402

install_timm_block()
builder = types.ModuleType("src.builder")
builder.BUILDER = types.SimpleNamespace(build=lambda cfg: cfg)  # pass built objects straight through
sys.modules["src.builder"] = builder

import torch  # noqa: E402

torch.Tensor.cuda = lambda self, *args, **kwargs: self  # the official sampler calls .cuda()
sys.path.insert(0, sys.argv[1])
from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402

import src.models.mar.diffloss as diffloss_module  # noqa: E402
import src.models.mar.diffusion.gaussian_diffusion as gd_module  # noqa: E402
from src.models.harmon import Harmon  # noqa: E402
from src.models.mar.mar import MAR  # noqa: E402

TEMPLATE = "<|im_start|>user\n{input}<|im_end|>\n<|im_start|>assistant\n"
PROMPTS = ["Generate an image: a red star", "Generate an image: a small blue star on a gradient"]
NULL = "Generate an image."


class CharTokenizer:
    eos_token_id = 1

    def encode(self, text, add_special_tokens=True, return_tensors=None):
        ids = [ord(c) % 120 + 2 for c in text]
        return torch.tensor([ids]) if return_tensors == "pt" else ids


class IdentityVAE(torch.nn.Module):
    embed_dim = 16

    def decode(self, z):
        return z


g = torch.Generator().manual_seed(4321)
llm_config = Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=128, max_position_embeddings=256, rope_theta=10000.0,
                         rms_norm_eps=1e-6, tie_word_embeddings=True)
llm_config._attn_implementation = "eager"
mar = MAR(img_size=64, vae_stride=16, patch_size=1, encoder_embed_dim=32, encoder_depth=1, encoder_num_heads=2,
          decoder_embed_dim=32, decoder_depth=1, decoder_num_heads=2, mlp_ratio=4,
          norm_layer=partial(torch.nn.LayerNorm, eps=1e-6), vae_embed_dim=16, class_num=10, buffer_size=4,
          diffloss_d=1, diffloss_w=32, num_sampling_steps="10")
ref = Harmon(vae=IdentityVAE(), vae_scale=1.0, llm=Qwen2ForCausalLM(llm_config), mar=mar,
             tokenizer=CharTokenizer(), prompt_template={"INSTRUCTION": TEMPLATE}).eval()
with torch.no_grad():
    for name, p in ref.named_parameters():
        base = 1.0 if "norm" in name and name.endswith("weight") else 0.0  # LayerNorm / RMSNorm scales near 1
        p.copy_(base + torch.randn(p.shape, generator=g) * 0.1)

# Prompts [p1, p2, null, null], right-padded with the eos id, as the official sampler takes them.
texts = [TEMPLATE.format(input=t) for t in PROMPTS + [NULL, NULL]]
rows = [CharTokenizer().encode(t) for t in texts]
width = max(len(r) for r in rows)
input_ids = torch.full((4, width), CharTokenizer.eos_token_id)
attention_mask = torch.zeros(4, width, dtype=torch.bool)
for i, r in enumerate(rows):
    input_ids[i, : len(r)] = torch.tensor(r)
    attention_mask[i, : len(r)] = True

out = {"state": ref.state_dict(), "texts": texts, "input_ids": input_ids, "attention_mask": attention_mask}
with torch.no_grad():
    for side in (4, 6):
        n = side * side
        tokens = torch.randn(2, n, 16, generator=g).repeat(2, 1, 1)  # [images; the same images], as CFG runs
        for name, known in (("masked", 0), ("half", n // 2), ("nearly", n - 1)):
            order = torch.randperm(n, generator=g)
            mask = torch.ones(4, n)
            mask[:, order[:known]] = 0.0
            x_enc = ref.forward_mae_encoder(tokens.view(4, side, side, 16), mask, input_ids=input_ids,
                                            attention_mask=attention_mask)
            z = ref.mar.forward_mae_decoder(x_enc, mask, image_shape=(side, side))
            out[f"z_{side}_{name}"] = {"tokens": tokens, "mask": mask.bool(), "z": z}
    z = out["z_4_half"]["z"].reshape(-1, 32)[:6]
    xt, tt = torch.randn(6, 16, generator=g), torch.tensor([0, 5, 100, 500, 900, 999])
    out["head"] = {"z": z, "x": xt, "t": tt, "out": ref.mar.diffloss.net(xt, tt, z)}

    # One whole run: orders fixed, every draw recorded (torch.randn for each step's initial noise,
    # randn_like for each transition), the predicted positions recorded.
    orders = torch.stack([torch.randperm(16, generator=g) for _ in range(2)])
    ref.mar.sample_orders = lambda bsz, seq_len=None: torch.cat([orders, orders])
    draws, steps = [], []
    real_randn, real_randn_like = torch.randn, torch.randn_like

    def randn(*shape, **kwargs):
        x = real_randn(*shape, generator=g)
        draws.append(("randn", x))
        return x

    def randn_like(x):
        e = real_randn(x.shape, generator=g)
        draws.append(("randn_like", e))
        return e

    class TorchWithRecordedRandn:  # the diffloss module's ``torch``, drawing its initial noise from g
        randn = staticmethod(randn)

        def __getattr__(self, name):
            return getattr(torch, name)

    diffloss_module.torch = TorchWithRecordedRandn()
    gd_module.th.randn_like = randn_like
    real_sample = ref.mar.diffloss.sample

    def sample(z, temperature=1.0, cfg=1.0):
        start = len(draws)
        x = real_sample(z, temperature, cfg)
        steps.append({"cfg": float(cfg), "x": x, "draws": [d for _, d in draws[start:]]})
        return x

    ref.mar.diffloss.sample = sample
    tokens = ref.sample(input_ids=input_ids, attention_mask=attention_mask, num_iter=4, cfg=3.0,
                        cfg_schedule="linear", temperature=0.9)
    torch.randn_like = real_randn_like
    out["run"] = {"orders": orders, "steps": steps, "cfg": 3.0, "cfg_schedule": "linear", "temperature": 0.9,
                  "num_iter": 4, "tokens": tokens.reshape(2, 16, 16).permute(0, 2, 1)}
torch.save(out, __file__.replace("make_harmon_reference.py", "harmon_reference.pt"))
print({k: tuple(v.shape) for k, v in out.items() if torch.is_tensor(v)}, len(steps), "steps")
