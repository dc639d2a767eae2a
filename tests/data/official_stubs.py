"""Stand-ins that let the official MAR and Harmon code run here without timm (which pulls torchvision)
or CUDA. Used only by the scripts that regenerate the reference numbers."""
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
def install_timm_block():
    """Install a minimal ``timm.models.vision_transformer.Block`` (timm's parameter names)."""
    _vt = types.ModuleType("timm.models.vision_transformer")
    exec(_TIMM_BLOCK, _vt.__dict__)
    sys.modules.update({"timm": types.ModuleType("timm"), "timm.models": types.ModuleType("timm.models"),
                        "timm.models.vision_transformer": _vt})
