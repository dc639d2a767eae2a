"""Regenerate tests/data/mar_reference.pt from the official MAR code.

Usage: python tests/data/make_mar_reference.py /path/to/official/mar   (a checkout of LTH14/mar whose
``.cuda()`` calls in diffusion/gaussian_diffusion.py are removed so it runs on the CPU). timm is not
needed: a stand-in ViT block with timm's parameter names (explicit softmax attention) is installed
below. The fixture pins the project's MAR, head and diffusion to the official numerics.
"""
import sys
import types

sys.path.insert(0, __file__.rsplit('/', 1)[0])
from official_stubs import install_timm_block  # noqa: E402

install_timm_block()
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
