"""What a text prompt asks for and how it is scored (class, shape colour, background), and the training
options that make a text model follow it (prompt-only rows, a loss weighted toward the shape)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from csd.models.harmon import Harmon
from csd.shapes.data import PALETTE, make_dataset
from csd.shapes.data import captions as data_captions
from csd.shapes.text import (
    BORDER_WIDTH,
    background_matches,
    border_colours,
    caption_tokenizer,
    prompt_background,
    prompt_class,
    prompt_colour,
    prompt_scores,
    text_config,
)
from tests.helpers import assert_differ64, assert_same64


def test_prompts_name_their_background_colours():
    assert prompt_background("a large red circle on a plain white background") == ("white",)
    assert prompt_background("a large red circle on a white background") == ("white",)
    assert prompt_background("a small cyan ring on a textured black background") == ("black",)
    assert prompt_background("a small red star on a blue to white gradient") == ("blue", "white")
    assert prompt_background("a small red star on a blue gradient") == ("blue",)
    assert prompt_background("a small red star on a blue to blue gradient") == ("blue",)
    assert prompt_background("a small red star") is None
    assert prompt_background("a red star on a blue") is None  # names no background


def _flat(rgb, size=32) -> torch.Tensor:
    return (torch.tensor(rgb, dtype=torch.float32)[:, None, None] * 2 - 1).expand(3, size, size).clone()


def test_the_border_rule_reads_a_hand_made_background():
    image = _flat(PALETTE["white"])
    image[:, 8:24, 8:24] = _flat(PALETTE["red"])[:, :16, :16]  # a red square inside the ring
    share = border_colours(image)
    assert share[list(PALETTE).index("white")] == 1.0 and share.sum() == pytest.approx(1.0)
    assert background_matches(image, ("white",)) and not background_matches(image, ("red",))
    # A shape reaching into the ring on one side does not change the most common border colour.
    image[:, :, :BORDER_WIDTH] = _flat(PALETTE["red"])[:, :, :BORDER_WIDTH]
    assert background_matches(image, ("white",))
    # Left half blue, right half white: a blue to white gradient's two ends, each on half the ring.
    ramp = _flat(PALETTE["white"])
    ramp[:, :, :16] = _flat(PALETTE["blue"])[:, :, :16]
    assert background_matches(ramp, ("blue", "white")) and background_matches(ramp, ("white", "blue"))
    assert not background_matches(ramp, ("red", "white"))


def test_real_images_match_their_own_backgrounds_and_not_others():
    data = make_dataset(400, seed=104)
    wanted = [prompt_background(c) for c in data.captions]
    assert all(w is not None for w in wanted)  # every caption names its background
    own = np.mean([background_matches(img, w) for img, w in zip(data.images, wanted, strict=True)])
    order = np.random.default_rng(0).permutation(len(wanted))
    other = np.mean([background_matches(img, wanted[j]) for img, j in zip(data.images, order, strict=True)])
    assert own >= 0.97  # measured 0.99 on 2000 held-out images
    assert other <= 0.4  # measured 0.25: the background colours' own spread


def test_prompt_scores_report_the_background():
    data = make_dataset(80, seed=11)
    scores = prompt_scores(data.images, data.captions)
    assert scores["background_accuracy"] >= 0.95
    assert prompt_scores(data.images, ["a red circle"] * 80)["background_accuracy"] is None  # none asked for


def test_the_dataset_holds_the_shape_coverage_of_each_pixel():
    data = make_dataset(20, seed=3)
    assert data.coverage.shape == (20, 32, 32) and data.coverage.dtype == torch.uint8
    inside, outside = data.coverage == 255, data.coverage == 0
    assert inside.any(dim=(1, 2)).all() and outside.any(dim=(1, 2)).all()
    # Uncovered pixels show the background: on a plain background they are all one colour.
    for img, cov, cap in zip(data.images, data.coverage, data.captions, strict=True):
        if " plain " in cap:
            bg = img[:, cov == 0]
            assert (bg - bg[:, :1]).abs().max() < 1e-6


def _tiny_text_model() -> Harmon:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return Harmon(text_config("random_text_target"), caption_tokenizer())


def test_prompt_only_rows_have_every_token_masked(monkeypatch):
    model = _tiny_text_model()
    tokens = torch.zeros(8, model.seq_len, model.token_dim)
    prompts = model.check_conditions(["a red circle on a plain white background"] * 8, 8, torch.device("cpu"))
    seen = []
    real = model.backbone
    monkeypatch.setattr(model, "backbone", lambda t, m, *a: (seen.append(m.clone()), real(t, m, *a))[1])
    model(tokens, prompts, torch.Generator().manual_seed(0), prompt_only=0.25)
    assert len(seen) == 2 and seen[0].shape[0] == 2 and seen[0].all()  # round(8 x 0.25) rows, all masked
    assert not seen[1].all(dim=1).all()  # the rest keep MAR's masks (some known tokens)
    seen.clear()
    model(tokens, prompts, torch.Generator().manual_seed(0))
    assert len(seen) == 1 and seen[0].shape[0] == 8


@pytest.mark.kernels
def test_without_the_options_the_loss_is_the_plain_one():
    """In float64 (a float64 copy of the model), the exact reference (tests/helpers.py)."""
    model = _tiny_text_model().double()
    gen = lambda: torch.Generator().manual_seed(1)
    tokens = torch.randn(4, model.seq_len, model.token_dim, generator=gen()).double()
    prompts = model.check_conditions(["a red circle"] * 4, 4, torch.device("cpu"))
    with torch.no_grad():
        plain = model(tokens, prompts, gen())
        ones = model(tokens, prompts, gen(), 0.0, torch.ones(4, model.seq_len, dtype=torch.float64))
        assert_same64(ones, plain, "weights of one")
        heavy = torch.ones(4, model.seq_len, dtype=torch.float64)
        heavy[:, 0] = 100.0
        assert_differ64(model(tokens, prompts, gen(), 0.0, heavy), plain, "a heavy first token", by=1e-2)


def test_token_weights_follow_the_shape_and_the_flip(tmp_path):
    from csd.training.text_models import TextTrainConfig, TextTrainer

    cfg = TextTrainConfig(
        config="random_text_target", out=str(tmp_path / "t"), data_size=8, batch_size=4, shape_weight=5.0, hflip=True
    )
    trainer = TextTrainer(cfg)
    idx = torch.arange(4)
    flip = torch.tensor([False, True, False, True])
    weight = trainer.token_weight(idx, flip)  # (4, 64)
    patch = trainer.tokenizer.patch_size
    for k in range(4):
        cover = trainer.coverage[k].float() / 255.0
        cover = cover.flip(-1) if flip[k] else cover
        share = cover.reshape(32 // patch, patch, 32 // patch, patch).mean(dim=(1, 3)).reshape(-1)
        assert torch.allclose(weight[k], 1.0 + 4.0 * share)
    assert weight.min() == 1.0 and weight.max() == 5.0  # background tokens 1, tokens inside the shape 5
    plain = TextTrainer(TextTrainConfig(config="random_text_target", out=str(tmp_path / "u"), data_size=8))
    assert plain.token_weight(idx, None) is None


@pytest.mark.parametrize(("field", "value"), [("prompt_only", 1.5), ("prompt_only", -0.1), ("shape_weight", 0.0)])
def test_bad_training_options_name_themselves(tmp_path, field, value):
    from csd.training.text_models import TextTrainConfig

    with pytest.raises(ValueError, match=field):
        TextTrainConfig(config="random_text_target", out=str(tmp_path / "t"), **{field: value})


# The shipped text target draws the colour and background a prompt asks for (issue 42). Measured on these
# 24 images (AVX-512): the shipped target colour 1.00, background 0.92 (one thread); the one
# shipped by issue 42 0.96 and 0.92, the same under every kernel perturbation of tests/kernels.py (one or two
# threads, oneDNN off, the AVX2 and default capabilities; the images moved by at most 6.8e-4); the one before
# it 0.08 and 0.33 (it drew the seed's colour, not the prompt's). The bounds leave 6 and 7 images of slack.
SHIPPED_COLOUR_PROMPTS = tuple(
    f"a large {colour} {shape} on a plain {bg} background"
    for colour, shape, bg in (
        ("red", "circle", "white"),
        ("blue", "square", "white"),
        ("green", "star", "black"),
        ("yellow", "heart", "black"),
        ("purple", "triangle", "white"),
        ("orange", "circle", "black"),
    )
)
SHIPPED_COLOUR_SEEDS = 4
SHIPPED_COLOUR_MIN = 0.75  # of the 24 images, the fraction whose shape has the asked colour
SHIPPED_BACKGROUND_MIN = 0.6  # ... and whose border has the asked background colour


@pytest.mark.slow
def test_the_shipped_text_target_draws_the_colour_and_background_it_is_asked_for():
    from pathlib import Path

    from csd.config import CSDConfig
    from csd.experiments import defaults
    from csd.experiments.evaluate import generate_images
    from csd.models.registry import load_model
    from csd.shapes.text import prompt_scores

    root = Path(__file__).resolve().parents[2]
    target = load_model(root / "assets" / "models" / "shapes_text_target.safetensors")
    prompts = [p for p in SHIPPED_COLOUR_PROMPTS for _ in range(SHIPPED_COLOUR_SEEDS)]
    seeds = list(range(len(prompts)))
    images, _ = generate_images("target", target, None, prompts, seeds, defaults.SAMPLING, CSDConfig(), 8)
    scores = prompt_scores(images, prompts)
    assert scores["colour_accuracy"] >= SHIPPED_COLOUR_MIN, scores
    assert scores["background_accuracy"] >= SHIPPED_BACKGROUND_MIN, scores


def test_every_example_prompt_pairs_a_colour_and_background_the_models_were_trained_on():
    """The app's example prompts ask for what the training data holds: a shape colour on a background it
    appears on (the data draws dark shapes on light backgrounds and light ones on dark: a blue shape on
    black never occurs, and the examples before issue 42 asked for it)."""
    from csd.serving.pairs import EXAMPLE_PROMPTS

    captions = data_captions(5000, seed=0)
    for prompt in EXAMPLE_PROMPTS:
        assert prompt_class(prompt) is not None and prompt_colour(prompt) and prompt_background(prompt), prompt
        pairing = (prompt_colour(prompt), prompt.split(" on ")[1])
        seen = sum((prompt_colour(c), c.split(" on ")[1]) == pairing for c in captions)
        assert seen >= 10, (prompt, seen)
    assert sum(("blue", "a plain black background") == (prompt_colour(c), c.split(" on ")[1]) for c in captions) == 0


def _prompts_result(modes=("target", "csd")) -> dict:
    example = {"class_accuracy": 0.5, "colour_accuracy": 0.75, "background_accuracy": 1.0}
    held = {"accuracy": 0.74, "colour_accuracy": 0.96, "background_accuracy": 0.74, "fd": 24.2}
    return {
        "kind": "prompts",
        "n": 100,
        "seeds_per_prompt": 8,
        "sampling": {"num_steps": 32, "cfg_scale": 3.0, "cfg_schedule": "linear"},
        "modes": {
            m: {
                "held_out": held | ({"acceptance_rate": 0.41} if m == "csd" else {}),
                "examples": {"a large red star on a plain white background": example},
                "examples_mean": example,
            }
            for m in modes
        },
    }


def test_a_prompt_result_becomes_its_table_and_the_docs_block(tmp_path):
    from visualize.report import report
    from visualize.tables import prompts_markdown

    table = prompts_markdown(_prompts_result())
    assert "| target only | 0.74 | 0.96 | 0.74 | 24.2 |  |" in table
    assert "| CSD (default) | 0.74 | 0.96 | 0.74 | 24.2 | 0.41 |" in table
    assert "| a large red star on a plain white background | 0.50 / 0.75 / 1.00 | 0.50 / 0.75 / 1.00 |" in table
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "results.md").write_text("x\n<!-- text-prompts:start -->\nold\n<!-- text-prompts:end -->\n")
    path = tmp_path / "prompts.json"
    path.write_text(json.dumps(_prompts_result()))
    report(path, root=tmp_path)
    assert (tmp_path / "prompts.md").read_text().startswith("# Prompt following")
    docs = (tmp_path / "docs" / "results.md").read_text()
    assert table.strip() in docs and "old" not in docs


def test_the_committed_prompt_scores_are_the_shipped_pairs_meet_the_colour_goals_and_are_in_the_docs():
    """bench/results/text/prompts.json (python -m csd.experiments.prompts, issue 42's protocol) was measured on
    the shipped text pair; the target's colour and background and the draft's colour meet issue 42's goals,
    CSD keeps the target's colour within 0.10; docs/results.md shows it."""
    from pathlib import Path

    from csd.models.checkpoint import file_digest
    from visualize.tables import prompts_markdown

    root = Path(__file__).resolve().parents[2]
    result = json.loads((root / "bench" / "results" / "text" / "prompts.json").read_text())
    models = root / "assets" / "models"
    shipped = models / "shapes_text_target.safetensors", models / "shapes_text_draft.safetensors"
    assert result["weights"] == file_digest(*shipped) and result["n"] == 100
    held = {m: r["held_out"] for m, r in result["modes"].items()}
    assert held["target"]["colour_accuracy"] >= 0.80 and held["target"]["background_accuracy"] >= 0.60
    assert held["draft"]["colour_accuracy"] >= 0.50
    assert held["csd"]["colour_accuracy"] >= held["target"]["colour_accuracy"] - 0.10
    assert prompts_markdown(result).strip() in (root / "docs" / "results.md").read_text()


def test_the_committed_causal_prompt_scores_are_the_shipped_pairs_meet_the_goals_and_are_in_the_docs():
    """bench/results/causal/prompts.json was measured on the shipped causal pair (100 held-out captions); its
    target draws the asked class (>= 0.85) and colour (>= 0.9), the draft's acceptance is recorded,
    and docs/results.md shows it in the causal pair's block."""
    from pathlib import Path

    from csd.models.checkpoint import file_digest
    from visualize.tables import prompts_markdown

    root = Path(__file__).resolve().parents[2]
    result = json.loads((root / "bench" / "results" / "causal" / "prompts.json").read_text())
    models = root / "assets" / "models"
    shipped = models / "shapes_causal_target.safetensors", models / "shapes_causal_draft.safetensors"
    assert result["weights"] == file_digest(*shipped) and result["n"] == 100 and result["family"] == "NextStep"
    held = {m: r["held_out"] for m, r in result["modes"].items()}
    assert held["target"]["accuracy"] >= 0.85 and held["target"]["colour_accuracy"] >= 0.9
    assert 0 < held["csd"]["acceptance_rate"] <= 1
    docs = (root / "docs" / "results.md").read_text()
    block = docs[docs.index("<!-- causal-prompts:start -->") : docs.index("<!-- causal-prompts:end -->")]
    assert prompts_markdown(result).strip() in block


def test_the_prompts_command_writes_its_settings_as_flat_knobs(tmp_path):
    """python -m csd.experiments.prompts records the settings as the configs' flat knobs (a sampler object is
    not JSON): the record rebuilds the configs it ran."""
    from pathlib import Path

    from csd.config import SamplingConfig
    from csd.experiments.prompts import main

    out, shipped = tmp_path / "prompts.json", Path(__file__).resolve().parents[2] / "assets" / "models"
    models = [str(shipped / f"shapes_causal_{role}.safetensors") for role in ("target", "draft")]
    flags = ["--n", "2", "--seeds-per-prompt", "1", "--num-steps", "64", "--modes", "target", "--head-sampler", "euler"]
    main(["--target", models[0], "--draft", models[1], *flags, "--out", str(out)])
    record = json.loads(out.read_text())
    sampling = SamplingConfig.from_knobs(**record["sampling"])
    assert (sampling.num_steps, sampling.sampler.kind) == (64, "euler") and record["family"] == "NextStep"
    assert record["modes"]["target"]["held_out"]["accuracy"] is not None


def test_a_prompt_result_goes_to_its_familys_docs_block(tmp_path):
    """A result that names its family is pasted into that family's block (the causal pair's: causal-prompts);
    the text pair's block stays as it was."""
    from visualize.report import report

    (tmp_path / "docs").mkdir()
    blocks = [
        f"<!-- {name}-prompts:start -->\n{text}\n<!-- {name}-prompts:end -->\n"
        for name, text in (("text", "text"), ("causal", "old"))
    ]
    page = "".join(blocks)
    (tmp_path / "docs" / "results.md").write_text(page)
    path = tmp_path / "prompts.json"
    path.write_text(json.dumps(_prompts_result() | {"family": "NextStep"}))
    report(path, root=tmp_path)
    docs = (tmp_path / "docs" / "results.md").read_text()
    assert (
        "\ntext\n" in docs and "old" not in docs and "| CSD (default) | 0.74 |" in docs.split("causal-prompts:start")[1]
    )
