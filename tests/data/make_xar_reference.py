"""Regenerate tests/data/xar_reference.pt from the official xAR code (OliverRensu/xAR).

Usage: python tests/data/make_xar_reference.py /path/to/xAR   (a checkout: its models/ is imported)

Nothing is edited in the checkout. Stand-ins: timm's SwiGLU (its layer names and forward: fc1_g, fc1_x,
act on the gate, fc2), LayerScale and DropPath (unused at drop 0), and an empty ``flash_attn`` (imported,
never called). The model is the official class at a tiny width on the official layout (a 16 x 16 grid,
4 cells of 64 tokens: the official code hard-codes both), random weights; the velocity of a whole
sequence is computed on the training path (block-causal mask, every cell its own time).
"""
import sys
import types

import torch
from torch import nn


class SwiGLU(nn.Module):  # timm.layers.SwiGLU at norm_layer=None, drop=0
    def __init__(self, in_features, hidden_features=None, out_features=None, act_layer=nn.SiLU, drop=0.0, **kw):
        super().__init__()
        out_features = out_features or in_features
        self.fc1_g = nn.Linear(in_features, hidden_features)
        self.fc1_x = nn.Linear(in_features, hidden_features)
        self.act = act_layer()
        self.fc2 = nn.Linear(hidden_features, out_features)

    def forward(self, x):
        return self.fc2(self.act(self.fc1_g(x)) * self.fc1_x(x))


timm, layers, vt = (types.ModuleType(n) for n in ("timm", "timm.layers", "timm.models.vision_transformer"))
layers.SwiGLU = SwiGLU
vt.LayerScale = vt.DropPath = nn.Identity
sys.modules.update({"timm": timm, "timm.layers": layers, "timm.models": types.ModuleType("timm.models"),
                    "timm.models.vision_transformer": vt, "flash_attn": types.ModuleType("flash_attn")})
sys.modules["flash_attn"].flash_attn_func = None
sys.path.insert(0, sys.argv[1])
from models.xar import xAR  # noqa: E402

g = torch.Generator().manual_seed(2468)
ref = xAR(img_size=256, vae_stride=16, encoder_embed_dim=32, encoder_depth=1, encoder_num_heads=2,
          decoder_embed_dim=32, decoder_depth=1, decoder_num_heads=2, mlp_ratio=4, class_num=1000)
with torch.no_grad():
    for name, p in ref.named_parameters():
        base = 1.0 if name.endswith("norm.weight") or name.endswith("ln.weight") else 0.0
        p.copy_(base + torch.randn(p.shape, generator=g) * 0.1)
ref.train()  # the whole-sequence path (no KV cache); dropout is 0
B = 2
x = torch.randn(B, 256, 16, generator=g)  # tokens in cell order
labels = torch.tensor([3, 1000])  # a class and the null class
t = torch.rand(B, 4, generator=g)
t[0, 0] = 0.0  # a clean context cell
with torch.no_grad():
    time_rows = torch.cat([t[:, k] for k in range(4)])  # official layout: row k * B + b is cell k of image b
    cond = ref.class_emb(labels).repeat(4, 1) + ref.time_embed((time_rows * 1000).long())
    h = ref.forward_mae_encoder(ref.z_proj(x), cond, ref.mask)
    v = ref.forward_mae_decoder(h, cond, ref.mask)
out = {"state": ref.state_dict(), "x": x, "labels": labels, "t": t, "v": v}

# A whole guided run (eval path: one cell at a time with the KV cache), every draw recorded: each cell's
# initial noise (torch.randn in sample_tokens) and each stochastic step's eps (randn_like in the sampler).
torch.Tensor.cuda = lambda self, *args, **kwargs: self
draws = []
real_randn = torch.randn


def randn(*shape, **kwargs):
    shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (list, tuple)) else shape
    z = real_randn(*shape, generator=g)
    draws.append(z)
    return z


def randn_like(x):
    z = real_randn(x.shape, generator=g, dtype=x.dtype)
    draws.append(z)
    return z


ref.eval()
torch.randn, torch.randn_like = randn, randn_like
with torch.no_grad():
    run_labels = torch.tensor([3, 7])
    tokens = ref.sample_tokens(num_steps=5, cfg=2.5, label=run_labels)  # (B, 16, 16, 16) raster
torch.randn = real_randn
out["run"] = {"labels": run_labels, "num_steps": 5, "cfg": 2.5, "draws": draws, "tokens": tokens}
torch.save(out, __file__.replace("make_xar_reference.py", "xar_reference.pt"))
print({k: tuple(val.shape) for k, val in out.items() if torch.is_tensor(val)}, len(out["state"]), "state entries")
