"""What reaches a text model's generator of its prompt: linear probes on the LLM's hidden states.

    python -m csd.shapes.text_probe assets/models/shapes_text_target.safetensors --n 3000

For held-out captions, the model runs its first AR step (every token unknown, as sampling starts):
the LLM reads the prompt, then the image rows (the MAR encoder's buffer through ``proj_in``). Three
features per caption are probed: the LLM's last hidden state at the image rows (their mean), the same
after ``proj_out`` (what is added to the encoder output, so what the generator is given), and, for
reference, the hidden state at the prompt's last word. A multinomial logistic regression is fitted on
a part of the captions and scored on the rest, for the shape's colour word, the class noun and the
first background colour word. Chance is printed beside each. A probe that reads the colour word at the
prompt's end but not at the image rows says the LLM knows it and the rows do not ask for it; one that
reads it after ``proj_out`` says the generator is given it, so the generator is what ignores it.

The data check beside it: the caption's colour word is the palette colour the shape was drawn with
(:func:`csd.shapes.data.caption_colour`), and the colour classifier's prediction on the real image
agrees with it at the rate printed.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from csd.cli import add_machine_flags, start_up
from csd.models.harmon import Harmon
from csd.models.registry import load_model
from csd.shapes.data import BACKGROUNDS, PALETTE, ShapesConfig, caption_colour, make_dataset
from csd.shapes.metrics import DEFAULT_COLOUR_CLASSIFIER, REFERENCE_SEED, load_classifier, predict


@torch.no_grad()
def prompt_features(model: Harmon, captions: Sequence[str], batch_size: int = 128) -> dict[str, Tensor]:
    """Per caption (n, width) features: 'rows' (LLM at the image rows), 'proj_out' (what the generator
    gets, (n, enc)), 'last_word' (LLM at the prompt's last token), at the first AR step."""
    out: dict[str, list[Tensor]] = {"rows": [], "proj_out": [], "last_word": []}
    mar, buf = model.mar, model.config.mar.buffer_size
    for start in range(0, len(captions), batch_size):
        chunk = list(captions[start : start + batch_size])
        prompts = model.check_conditions(chunk, len(chunk), torch.device("cpu"))
        b = len(chunk)
        tokens = torch.zeros(b, model.seq_len, model.token_dim)
        mask = torch.ones(b, model.seq_len, dtype=torch.bool)
        x_enc = mar.forward_mae_encoder(tokens, mask, mar.fake_latent.expand(b, -1))  # (B, buf, enc)
        rows = model.proj_in(x_enc)
        embeds = model.llm.get_input_embeddings()(prompts.ids)
        full = torch.cat([prompts.attn, prompts.attn.new_ones(b, rows.shape[1])], dim=1)
        positions = (full.long().cumsum(1) - 1).clamp(min=0)
        hidden = model.llm.model(
            inputs_embeds=torch.cat([embeds, rows], dim=1), attention_mask=full, position_ids=positions, use_cache=False
        ).last_hidden_state
        image_rows = hidden[:, -buf:]  # (B, buf, width)
        last = prompts.attn.long().sum(1) - 1
        out["rows"].append(image_rows.mean(1))
        out["proj_out"].append(model.proj_out(image_rows).mean(1))
        out["last_word"].append(hidden[torch.arange(b), last])
    return {k: torch.cat(v).float() for k, v in out.items()}


def linear_probe(x: Tensor, y: Tensor, train: int, steps: int = 300, weight_decay: float = 1e-4) -> float:
    """Held-out accuracy of a multinomial logistic regression fitted (L-BFGS) on the first ``train`` rows."""
    mu, sd = x[:train].mean(0), x[:train].std(0).clamp(min=1e-6)
    x = (x - mu) / sd
    classes = int(y.max()) + 1
    w = torch.zeros(x.shape[1], classes, requires_grad=True)
    b = torch.zeros(classes, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=steps, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(x[:train] @ w + b, y[:train]) + weight_decay * (w**2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        return float(((x[train:] @ w + b).argmax(1) == y[train:]).float().mean())


def probe(path: str, n: int = 3000, train_fraction: float = 0.7, seed: int = REFERENCE_SEED + 7) -> dict:
    model = load_model(path)
    if model.traits.conditions != "prompts":
        raise ValueError(f"{path} is not a text (Harmon-layout) model")
    model.eval()
    size = model.config.mar.img_size
    data = make_dataset(n, seed, ShapesConfig(image_size=size))
    captions = data.captions
    colour = torch.tensor([caption_colour(c) for c in captions])
    words = [c.split() for c in captions]
    names = list(PALETTE)
    background = torch.tensor([names.index(next(w for w in ws[ws.index("on") + 1 :] if w in PALETTE)) for ws in words])
    labels = {"colour word": colour, "class noun": data.labels, "first background colour": background}
    agreement = float(np.mean(predict(data.images, load_classifier(DEFAULT_COLOUR_CLASSIFIER)) == colour.numpy()))
    feats = prompt_features(model, captions)
    train = int(n * train_fraction)
    result = {
        "model": path,
        "n": n,
        "held_out": n - train,
        "caption_colour_vs_colour_classifier": round(agreement, 4),
        "backgrounds": list(BACKGROUNDS),
        "probes": {},
    }
    for target, y in labels.items():
        chance = float(torch.bincount(y[train:]).max()) / (n - train)
        result["probes"][target] = {"chance (majority)": round(chance, 3)} | {
            name: round(linear_probe(x, y, train), 3) for name, x in feats.items()
        }
    return result


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m csd.shapes.text_probe", description=__doc__.split("\n")[0])
    p.add_argument("models", nargs="+", help="text models (.safetensors)")
    p.add_argument("--n", type=int, default=3000, help="held-out captions (70%% fit the probe)")
    add_machine_flags(p, device=False)
    args = p.parse_args(argv)
    start_up(args, p)
    for path in args.models:
        print(json.dumps(probe(path, args.n), indent=1))


if __name__ == "__main__":
    main()
