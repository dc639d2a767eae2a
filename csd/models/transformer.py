"""Pre-norm ViT block with the parameter names of timm's ``Block`` (as in official MAR checkpoints)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


def dropped(drop: nn.Dropout, x: Tensor) -> Tensor:
    """``drop(x)``, skipped where it is the identity (evaluation, or p = 0): no op call, the same numbers."""
    return drop(x) if drop.training and drop.p > 0.0 else x


class Attention(nn.Module):
    def __init__(self, dim: int, num_heads: int, attn_drop: float = 0.0, proj_drop: float = 0.0):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"embed dim {dim} must be divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.attn_drop = attn_drop
        self.proj_drop = nn.Dropout(proj_drop)

    def heads(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x (B, n, C) -> q, k, v, each (B, heads, n, C / heads)."""
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, c // self.num_heads).permute(2, 0, 3, 1, 4)
        return q, k, v

    def attend(self, q: Tensor, k: Tensor, v: Tensor, seen: Tensor | None = None) -> Tensor:
        """Queries (B, heads, m, hd) over keys and values (B, heads, n, hd) -> (B, m, C), projected. ``seen``
        (B, n) bool: the keys each row attends to (None: every key)."""
        b, h, m, d = q.shape
        mask = None if seen is None else seen[:, None, None, :]
        out = F.scaled_dot_product_attention(q, k, v, mask, dropout_p=self.attn_drop if self.training else 0.0)
        return dropped(self.proj_drop, self.proj(out.transpose(1, 2).reshape(b, m, h * d)))

    def forward(self, x: Tensor, seen: Tensor | None = None) -> Tensor:
        return self.attend(*self.heads(x), seen)


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int, drop: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x: Tensor) -> Tensor:
        return dropped(self.drop, self.fc2(dropped(self.drop, self.act(self.fc1(x)))))


class Block(nn.Module):
    def __init__(
        self, dim: int, num_heads: int, mlp_ratio: float = 4.0, attn_drop: float = 0.0, proj_drop: float = 0.0
    ):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, num_heads, attn_drop, proj_drop)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), proj_drop)

    def forward(self, x: Tensor, seen: Tensor | None = None) -> Tensor:
        """x (B, n, C); ``seen`` (B, n) bool: the rows attention reads (None: every row)."""
        x = x + self.attn(self.norm1(x), seen)
        return x + self.mlp(self.norm2(x))

    def forward_kv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The block's output and its attention's keys and values (B, heads, n, hd): the numbers of
        :meth:`forward`, for a caller that keeps them (LazyMAR's token cache)."""
        q, k, v = self.attn.heads(self.norm1(x))
        x = x + self.attn.attend(q, k, v)
        return x + self.mlp(self.norm2(x)), k, v

    def forward_rows(self, rows: Tensor, index: Tensor, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The block over some rows of a sequence whose other rows' keys and values are kept.

        rows (B, m, C) at positions ``index`` (B, m) of the sequence; keys, values (B, heads, n, hd) of
        every position from before. Returns the rows' outputs and the keys and values with these rows'
        written in. With every position in order (index = arange(n)) the numbers of :meth:`forward_kv`."""
        q, k, v = self.attn.heads(self.norm1(rows))
        at = index[:, None, :, None].expand(-1, k.shape[1], -1, k.shape[-1])
        keys, values = keys.scatter(2, at, k), values.scatter(2, at, v)
        rows = rows + self.attn.attend(q, keys, values)
        return rows + self.mlp(self.norm2(rows)), keys, values
