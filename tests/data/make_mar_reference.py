"""Regenerate tests/data/mar_reference.pt from the official MAR code.

Usage: python tests/data/make_mar_reference.py /path/to/official/mar   (a checkout of LTH14/mar whose
``.cuda()`` calls in diffusion/gaussian_diffusion.py are removed so it runs on the CPU). timm is not
needed: a stand-in ViT block with timm's parameter names (explicit softmax attention) is installed
below. The fixture pins the project's MAR, head and diffusion to the official numerics.
"""
import sys
import types

_TIMM_BLOCK = """
# Minimal stand-in for timm's ViT Block (same parameter names), explicit softmax attention.
import torch, torch.nn as nn
class _Attn(nn.Module):
    def __init__(s, dim, heads, qkv_bias):
        super().__init__(); s.h=heads; s.qkv=nn.Linear(dim,3*dim,bias=qkv_bias); s.proj=nn.Linear(dim,dim)
    def forward(s,x):
        B,N,C=x.shape; qkv=s.qkv(x).reshape(B,N,3,s.h,C//s.h).permute(2,0,3,1,4); q,k,v=qkv[0],qkv[1],qkv[2]
        a=(q@k.transpose(-2,-1))*(C//s.h)**-0.5; a=a.softmax(-1); return s.proj((a@v).transpose(1,2).reshape(B,N,C))
class _Mlp(nn.Module):
    def __init__(s,dim,hid):
        super().__init__(); s.fc1=nn.Linear(dim,hid); s.act=nn.GELU(); s.fc2=nn.Linear(hid,dim)
    def forward(s,x): return s.fc2(s.act(s.fc1(x)))
class Block(nn.Module):
    def __init__(s, dim, num_heads, mlp_ratio=4., qkv_bias=False, norm_layer=nn.LayerNorm, proj_drop=0., attn_drop=0.):
        super().__init__(); s.norm1=norm_layer(dim); s.attn=_Attn(dim,num_heads,qkv_bias); s.norm2=norm_layer(dim); s.mlp=_Mlp(dim,int(dim*mlp_ratio))
    def forward(s,x):
        x=x+s.attn(s.norm1(x)); return x+s.mlp(s.norm2(x))
"""
_vt = types.ModuleType("timm.models.vision_transformer")
exec(_TIMM_BLOCK, _vt.__dict__)
sys.modules.update({"timm": types.ModuleType("timm"), "timm.models": types.ModuleType("timm.models"),
                    "timm.models.vision_transformer": _vt})
import sys, torch
from functools import partial
sys.path.insert(0, sys.argv[1])
import diffusion.gaussian_diffusion as refgd
from models.mar import MAR
g = torch.Generator().manual_seed(1234)
ref = MAR(img_size=64, vae_stride=16, patch_size=1, encoder_embed_dim=32, encoder_depth=1, encoder_num_heads=2,
          decoder_embed_dim=32, decoder_depth=1, decoder_num_heads=2, mlp_ratio=4, norm_layer=partial(torch.nn.LayerNorm, eps=1e-6),
          vae_embed_dim=16, class_num=10, buffer_size=4, diffloss_d=1, diffloss_w=32, num_sampling_steps='10').eval()
with torch.no_grad():
    for p in ref.parameters(): p.copy_(torch.randn(p.shape, generator=g) * 0.05)
B, N, d, T = 2, 16, 16, 10
tokens = torch.randn(B, N, d, generator=g)
mask = torch.zeros(B, N); order = torch.stack([torch.randperm(N, generator=g) for _ in range(B)])
mask.scatter_(1, order[:, :10], 1.0)
labels = torch.tensor([3, 7])
out = {}
with torch.no_grad():
    ce = ref.class_emb(labels)
    z = ref.forward_mae_decoder(ref.forward_mae_encoder(tokens, mask, ce), mask)
    out.update(state=ref.state_dict(), tokens=tokens, mask=mask.bool(), labels=labels, z=z)
    # head network output at (x_t, t, z)
    zr = z.reshape(B * N, -1)[:6]; xt = torch.randn(6, d, generator=g); tt = torch.tensor([0, 5, 100, 500, 900, 999])
    out.update(head_z=zr, head_x=xt, head_t=tt, head_out=ref.diffloss.net(xt, tt, zr))
    # full chains with scripted noise
    xi = torch.randn(6, d, generator=g); eps = torch.randn(T - 1, 6, d, generator=g); zu = torch.randn(6, 32, generator=g)
    out.update(chain_xi=xi, chain_eps=eps, chain_zu=zu)
    for cfg in (1.0, 3.0):
        for temp in (1.0, 0.7):
            it = iter(list(eps) + [torch.zeros(6, d)])
            refgd.th.randn_like = lambda x, it=it: (lambda e: torch.cat([e] * (x.shape[0] // 6)))(next(it))
            if cfg == 1.0:
                x = ref.diffloss.gen_diffusion.p_sample_loop(ref.diffloss.net.forward, xi.shape, xi, clip_denoised=False,
                                                             model_kwargs=dict(c=zr), temperature=temp)
            else:
                x2 = torch.cat([xi, xi])
                x = ref.diffloss.gen_diffusion.p_sample_loop(ref.diffloss.net.forward_with_cfg, x2.shape, x2, clip_denoised=False,
                                                             model_kwargs=dict(c=torch.cat([zr, zu]), cfg_scale=cfg), temperature=temp)[:6]
            out[f"chain_x_cfg{cfg:g}_temp{temp:g}"] = x
    # training loss at fixed t and noise
    x0 = torch.randn(6, d, generator=g).clamp(-1, 1); noise = torch.randn(6, d, generator=g)
    out.update(loss_x0=x0, loss_noise=noise, loss_t=tt,
               loss=ref.diffloss.train_diffusion.training_losses(ref.diffloss.net, x0, tt, dict(c=zr), noise=noise)["loss"])
torch.save(out, __file__.replace('make_mar_reference.py', 'mar_reference.pt'))
print({k: tuple(v.shape) for k, v in out.items() if torch.is_tensor(v)})
