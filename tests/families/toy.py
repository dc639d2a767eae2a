"""A fourth family, defined only in the tests: a tiny causal next-token model with a diffusion head.

Images (32 x 32 RGB) are cut into 8 x 8 pixel patches, one token each, made in raster order, one per AR
step (so its AR steps are fixed: 16). A causal transformer reads the class (a learned embedding; one more
for "no class", classifier-free guidance) and the tokens before each position, and a MAR-style diffusion
head (:class:`csd.models.head.DiffusionHead`) turns each position's output into the token's Gaussian chain.
Verifying a drafted block is one pass over the context with the drafted tokens in place: a causal model
conditions each drafted token on those drafted before it (``verifies_in_context``).

Everything the project needs of it is :data:`FAMILY`, its row (the samplers, the project files), and
:data:`ENTRY`, its catalog entry: the pairs (an embedded pair whose files a test writes, an untrained pair, a
paper-scale pair) and how it runs at "paper scale". Nothing outside this module names it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from csd.config import PRECISIONS
from csd.core.chain import HeadChain, HeadCondition
from csd.core.schedule import step_cfg_scales
from csd.family import FamilyTraits, ModelState, Plan
from csd.models.head import DiffusionHead
from csd.models.mar import check_labels, gather_rows
from csd.models.spec import TINY_WIDTHS, CostShape, Family, PaperScale, SerialConfig, stack
from csd.serving.catalog import Entry, PairSpec


@dataclass(frozen=True)
class ToyConfig(SerialConfig):
    """img_size x img_size RGB images in patch x patch tokens; a causal transformer of ``depth`` blocks of
    ``width``; a diffusion head of ``head_depth`` blocks of ``head_width``, ``head_steps`` steps by default."""

    img_size: int = 32
    patch_size: int = 8
    num_classes: int = 10
    width: int = 32
    depth: int = 1
    num_heads: int = 2
    head_width: int = 32
    head_depth: int = 1
    head_steps: int = 4

    @property
    def seq_len(self) -> int:
        return (self.img_size // self.patch_size) ** 2

    @property
    def token_dim(self) -> int:
        return 3 * self.patch_size**2

    def traits(self) -> FamilyTraits:
        return FamilyTraits(
            "Toy", "classes", num_classes=self.num_classes, fixed_num_steps=self.seq_len, verifies_in_context=True
        )


class CausalBlock(nn.Module):
    """Pre-norm attention (each position reads itself and those before it) and MLP."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: Tensor) -> Tensor:
        b, n, w = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(b, n, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, n, w)
        x = x + self.proj(att)
        return x + self.mlp(self.norm2(x))


class ToyAR(nn.Module):
    """The network and its :class:`csd.family.ModelFamily` methods."""

    def __init__(self, config: ToyConfig):
        super().__init__()
        c = self.config = config
        self.seq_len, self.token_dim = c.seq_len, c.token_dim
        self.class_emb = nn.Embedding(c.num_classes + 1, c.width)  # the last: no class
        self.token_in = nn.Linear(c.token_dim, c.width)
        self.pos = nn.Parameter(0.02 * torch.randn(1, c.seq_len, c.width))
        self.blocks = nn.ModuleList(CausalBlock(c.width, c.num_heads) for _ in range(c.depth))
        self.norm = nn.LayerNorm(c.width)
        self.head = DiffusionHead(c.token_dim, c.width, c.head_width, c.head_depth, c.head_steps, clip_x0=1.0)

    @property
    def traits(self) -> FamilyTraits:
        return self.config.traits()

    def backbone(self, tokens: Tensor, labels: Tensor) -> Tensor:
        """(B, N, width): position i reads the class and tokens[:, :i] (B, N, d)."""
        x = torch.cat([self.class_emb(labels)[:, None], self.token_in(tokens[:, :-1])], dim=1) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.norm(x)

    def conditions(self, tokens: Tensor, labels: Tensor, config) -> tuple[Tensor, Tensor | None]:
        """z and, when guided, z without the class (B, N, width), at the config's backbone precision."""
        guided = config.guided
        if guided:
            tokens, labels = (
                torch.cat([tokens, tokens]),
                torch.cat([labels, torch.full_like(labels, self.config.num_classes)]),
            )
        dtype = PRECISIONS[config.precision]
        with torch.autocast(tokens.device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            z = self.backbone(tokens, labels).to(config.dtype)  # the run's dtype: float32, or float64
        return z.chunk(2) if guided else (z, None)

    # --- the samplers' view (csd.family.ModelFamily) ----------------------------------------------------

    def check_conditions(self, conditions, batch: int, device: torch.device) -> Tensor:
        return check_labels(conditions, self.config.num_classes, batch, device)

    def plan(self, seeds: Sequence[int], config, device: torch.device) -> Plan:
        """Raster order, one token per AR step, whatever the seed."""
        orders = (
            torch.arange(self.seq_len, device=device).flip(0).expand(len(seeds), -1)
        )  # step s makes orders[:, -s-1]
        sizes = [1] * self.seq_len
        return Plan(orders, sizes, step_cfg_scales(config.cfg_scale, config.cfg_schedule, sizes))

    def head_steps(self, steps: int | None) -> int:
        return self.head.chain(steps).num_steps()

    def start(self, conditions, config) -> ModelState:
        """Nothing is kept between passes: the state is the conditions and the settings."""
        return ModelState(conditions, config)

    def predict(self, state: ModelState, tokens, mask, pos, cfg, steps: int, known=None) -> HeadChain:
        config = state.config
        z, z_uncond = self.conditions(tokens, state.conditions, config)
        cond = (
            HeadCondition(gather_rows(z, pos))
            if z_uncond is None
            else HeadCondition(gather_rows(z, pos), gather_rows(z_uncond, pos), cfg)
        )
        return HeadChain(self.head.chain(steps), cond, config.temperature)

    def verify(
        self, state: ModelState, tokens, mask, pos, cfg, steps: int, drafted=None, sizes=None, known=None
    ) -> HeadChain:
        """One pass with the drafted tokens (B*k, d) in place: each is verified given those drafted before it."""
        if drafted is not None:
            tokens = tokens.scatter(1, pos[..., None].expand(-1, -1, self.token_dim), drafted.reshape(*pos.shape, -1))
        return self.predict(state, tokens, mask, pos, cfg, steps)

    def join(self, chains: Sequence[HeadChain], batch: int) -> HeadChain:
        first = chains[0]
        return HeadChain(first.head, HeadCondition.join([c.cond for c in chains], batch), first.temperature)

    def check_draft(self, draft) -> None:
        """Nothing beyond the shared layout (class labels, the same grid)."""

    def token_layout(self, raster_tokenizer):
        return raster_tokenizer


# --- its row --------------------------------------------------------------------------------------------

PRESETS = {
    "toy_target": ToyConfig(width=32, depth=2),
    "toy_draft": ToyConfig(width=16, depth=1),
    "toy_large": ToyConfig(width=256, depth=8, num_heads=4, head_width=256, head_depth=3, head_steps=50),
    "toy_base": ToyConfig(width=128, depth=4, num_heads=4, head_width=128, head_depth=2, head_steps=50),
}
LAYER_KERNELS = 20  # a guess at the aten ops of one CausalBlock, for the estimate


def tiny(name: str, tiny: bool) -> dict:
    """The paper-scale configs shrunk by --tiny: width by size, one block, few head steps."""
    if not tiny:
        return {}
    w = TINY_WIDTHS[{"toy_large": "large", "toy_base": "base"}[name]]
    return dict(width=w, depth=1, head_width=w, head_depth=1, head_steps=4)


def cost_shape(model: ToyAR, prompt: int = 0) -> CostShape:
    c = model.config
    head = sum(p.numel() for p in model.head.parameters())
    params = sum(p.numel() for p in model.parameters())
    return CostShape(params, stack(model.blocks, c.width, LAYER_KERNELS), None, None, head, c.head_depth, c.seq_len)


FAMILY = Family(
    arch="toy",
    model=ToyAR,
    config=ToyConfig,
    presets=PRESETS,
    traits=ToyConfig.traits,
)
ENTRY = Entry(
    pairs=(
        PairSpec("toy (embedded)", "toy", "toy_target", "toy_draft", "embedded"),
        PairSpec("Toy-L / Toy-B", "toy", "toy_large", "toy_base", "official", key="H/B", paper_name="Toy-L / Toy-B"),
        PairSpec("random toy (untrained)", "toy", "toy_target", "toy_draft", "random"),
    ),
    paper=PaperScale(
        cfg={"toy_large": 2.0, "toy_base": 2.0},
        cfg_schedule="linear",
        num_steps=None,
        head_steps=None,
        tiny_steps=(None, None),
        overrides=tiny,
        layout=lambda config, head_steps: (config.seq_len, head_steps or config.head_steps),
        cost=cost_shape,
    ),
)
