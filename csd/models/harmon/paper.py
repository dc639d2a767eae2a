"""Harmon at the published sizes (:mod:`csd.experiments.paper_scale`).

Published settings (wusize/Harmon ``scripts/text2image.py`` and ``configs/models``): 64 AR steps, cfg 3.0
constant, temperature 1.0, 512 px (1024 KL-16 tokens), Qwen2.5-1.5B + MAR-H generator (1.5B) and
Qwen2.5-0.5B + MAR-B (0.5B), 100 head steps. With random weights the prompt tokenizer is a stand-in
:class:`WordTokenizer` and every prompt has the official length: :data:`PROMPT_TOKENS` tokens, the template
``<|im_start|>user\\nGenerate an image: {prompt}<|im_end|>\\n<|im_start|>assistant\\n`` around the script's
default prompt "a dog on the left and a cat on the right." (8 template + 16 prompt tokens, counted by hand
for Qwen2.5's tokenizer), and a null prompt of :data:`NULL_PROMPT_TOKENS` ("Generate an image."). ``--tiny``
shrinks the MAR generator as MAR's and the LLM to one layer of the same width.
"""

from __future__ import annotations

import torch
from torch import nn

from csd.models.harmon.network import harmon_config
from csd.models.harmon.prompt_batch import WordTokenizer
from csd.models.mar.network import mar_config
from csd.models.mar.paper import cost_shape as mar_cost_shape
from csd.models.mar.paper import tiny_overrides as mar_tiny_overrides
from csd.models.spec import TINY_WIDTHS, CostShape, PaperScale, stack

PROMPT = "a dog on the left and a cat on the right."  # wusize/Harmon scripts/text2image.py's default
PROMPT_TOKENS, NULL_PROMPT_TOKENS = 24, 12  # it and the null prompt in the official template, in Qwen2.5 tokens
TINY_PROMPT_TOKENS, TINY_NULL_TOKENS = 6, 3
LLM_LAYER_KERNELS = 60  # aten ops per Qwen2 layer, counted on the tiny models
SIZES = {"harmon_1.5b": "huge", "harmon_0.5b": "base"}  # the MAR generator's size
STAND_IN = WordTokenizer([f"word{i}" for i in range(64)])  # random weights: a word-level stand-in tokenizer


def overrides(name: str, tiny: bool) -> dict:
    """A word-level prompt template whose null prompt has the official null prompt's length in stand-in
    words; --tiny shrinks the generator (as MAR's) and the LLM."""
    null = (TINY_NULL_TOKENS if tiny else NULL_PROMPT_TOKENS) - 1  # + the start token
    over = dict(template="{input}", prefix="{prompt}", null_prompt=" ".join(STAND_IN.words[:null]))
    if not tiny:
        return over
    size = SIZES[name]
    w, llm = TINY_WIDTHS[size], harmon_config(name).llm
    sizes = dict(hidden_size=w, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    llm = {**llm, **sizes, "intermediate_size": 2 * w, "vocab_size": 128}
    generator = f"mar_{size}"
    return over | dict(mar=mar_config(generator, **mar_tiny_overrides(generator, True)), llm=llm, grid_side=None)


def cost_shape(model: nn.Module, prompt: int) -> CostShape:
    """MAR's generator plus the LLM over the prompt and the context."""
    llm = stack(model.llm.model.layers, model.config.llm["hidden_size"], LLM_LAYER_KERNELS)
    return mar_cost_shape(model, model.mar, llm, prompt)


def stand_in_prompts(generator: torch.Generator, batch: int, words: int) -> list[str]:
    """``batch`` prompts of ``words`` random stand-in words."""
    ids = torch.randint(len(STAND_IN.words), (batch, words), generator=generator)
    return [" ".join(STAND_IN.words[i] for i in row) for row in ids.tolist()]


def prompt_length(model: nn.Module, prompt: str) -> int:
    """Tokens of ``prompt`` as the model encodes it, start token and template included."""
    return int(model.check_conditions([prompt], 1, torch.device("cpu")).ids.shape[1])


PAPER = PaperScale(
    cfg={"harmon_1.5b": 3.0, "harmon_0.5b": 3.0},
    cfg_schedule="constant",
    num_steps=64,
    head_steps=100,
    tiny_steps=(8, 4),
    overrides=overrides,
    layout=lambda config, head_steps: (config.side**2, head_steps),
    cost=cost_shape,
    meta=lambda tiny: {"tokenizer": STAND_IN.to_dict()},
    prompt_tokens=(PROMPT_TOKENS, NULL_PROMPT_TOKENS),
    tiny_prompt_tokens=(TINY_PROMPT_TOKENS, TINY_NULL_TOKENS),
    stand_in_prompts=stand_in_prompts,
    prompt=PROMPT,
    prompt_length=prompt_length,
)
