"""Harmon as a model family: prompts, the caption tokenizer, sampling and CSD through the family
interface, files, and the text trainer. Runs are compared in float64, the exact reference (tests/helpers.py):
batch invariance, the prompt cache and CSD's pre-fill hold up to float64 rounding on every CPU; in float32
up to rounding."""

import pytest
import torch

pytest.importorskip("transformers")

from csd.config import CSDConfig, SamplingConfig
from csd.core.precision import at_precision
from csd.family import MAX_PROMPT_CHARS
from csd.models.harmon import Harmon, HarmonConfig, WordTokenizer, harmon_config, qwen2
from csd.models.mar import mar_config
from csd.models.registry import load_model, save_model
from csd.sampling import generate
from csd.shapes.data import captions, make_dataset
from csd.shapes.text import CAPTION_WORDS, TEXT_CONFIGS, caption_tokenizer, prompt_class, prompt_colour
from csd.speculative import speculative_generate
from csd.trace import Maker
from tests.helpers import assert_differ64, assert_same64, sampling64

PROMPTS = ["a small red star on a blue gradient", "a large green circle on a plain white background"]


def tiny(seed: int, width: int = 32) -> Harmon:
    tok = caption_tokenizer()
    config = HarmonConfig(
        mar_config("mar_test", clip_x0=1.0),
        qwen2(width, 1, 2, 1, 64, len(tok)),
        template="{input}",
        prefix="{prompt}",
        null_prompt="",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Harmon(config, tok).eval()
        with torch.no_grad():  # as the MAR tests do: zero-initialised layers would make every model alike
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
    return model


@pytest.fixture(scope="module")
def pair(one_thread):
    return tiny(0, 48), tiny(1, 32)


@pytest.fixture(scope="module")
def pair64(pair):
    """The same pair in float64."""
    return tuple(at_precision(m, "float64") for m in pair)


def test_the_caption_tokenizer_knows_every_caption_word_and_names_the_vocabulary_otherwise():
    tok = caption_tokenizer()
    for caption in captions(500, seed=3):
        ids = tok.encode(caption)
        assert ids[0] == tok.bos_token_id and len(ids) == len(caption.split()) + 1
    with pytest.raises(ValueError, match=r"\['dragon', 'purple-ish'\] are not in the vocabulary of this model.*circle"):
        tok.encode("a purple-ish dragon")
    assert tok.encode("A Red STAR.") == tok.encode("a red star")
    assert len(tok) == len(CAPTION_WORDS) + 2


def test_prompts_name_their_class_and_colour():
    assert prompt_class("a small red star on a blue gradient") == 3 and prompt_colour(PROMPTS[0]) == "red"
    assert prompt_class("a large blue stripes pattern on a plain black background") == 8
    assert prompt_colour("a large blue stripes pattern on a plain black background") == "blue"
    assert prompt_class("a blue gradient") is None and prompt_colour("a blue gradient") is None


@pytest.mark.parametrize(
    "prompts,match",
    [
        ([""], "prompt 0 must not be empty"),
        (["   "], "prompt 0 must not be empty"),
        (["a " * 5000], f"prompt 0 must be at most {MAX_PROMPT_CHARS} characters, got 10000"),
        ([3], "prompt 0 must be a string"),
        ("a red star", "prompts must be a list of strings"),
        (["a red star", "a red star"], r"one prompt per seed \(1\), got 2"),
    ],
)
def test_bad_prompts_are_refused_by_name(pair, prompts, match):
    with pytest.raises(ValueError, match=match):
        generate(pair[0], prompts, [0], SamplingConfig(num_steps=2))


@pytest.mark.kernels
def test_generation_is_seeded_and_batch_invariant(pair64):
    """Exactly in float64; in float32 up to rounding."""
    target, _ = pair64
    s = sampling64(num_steps=4, cfg_scale=3.0)
    both = generate(target, PROMPTS, [5, 6], s)
    alone = generate(target, PROMPTS[1:], [6], s)
    assert_same64(alone.tokens[0], both.tokens[1], "image 1 alone")  # other prompt lengths
    assert_same64(generate(target, PROMPTS, [5, 6], s).tokens, both.tokens, "the same seeds again")
    other = generate(target, [PROMPTS[1], PROMPTS[1]], [5, 6], s)
    assert_differ64(other.tokens[0], both.tokens[0], "another prompt", by=1e-2)  # the prompt conditions the image


def _recomputed(model, tokens, mask, prompts, guided, prompt_kv=None, known=None):
    """What Harmon.conditions computes, with the prompt run again in the pass (``prompt_kv``, the generation's
    prompt caches, left unread)."""
    b = tokens.shape[0]
    if not guided:
        return model.backbone(tokens, mask, prompts.ids, prompts.attn, known=known), None
    ids, attn, null_ids, null_attn = prompts.both(model.tokenizer.pad_token_id)
    two = lambda t: torch.cat([t, t])
    z = model.backbone(two(tokens), two(mask), torch.cat([ids, null_ids]), torch.cat([attn, null_attn]), known=known)
    return z[:b], z[b:]


@pytest.mark.kernels
@pytest.mark.parametrize("guided", [False, True])
def test_the_prompt_kv_cache_gives_the_numbers_of_running_the_prompt_again(pair64, guided):
    """In float64: the same numbers up to float64 rounding."""
    model = pair64[0]
    prompts = model.check_conditions(["a red star", PROMPTS[1]], 2, torch.device("cpu"))  # padded: unequal lengths
    kv: dict = {}  # a generation's prompt caches (its state's prompt_kv)
    g = torch.Generator().manual_seed(0)
    for step in range(3):  # the cache is made at the first step and read, cropped back, at the others
        tokens = torch.randn(2, model.seq_len, model.token_dim, generator=g).double()
        order = torch.stack([torch.randperm(model.seq_len, generator=g) for _ in range(2)])
        mask = order < model.seq_len - 4 * (step + 1)  # as many unknown per image, fewer each step
        z, z_uncond = model.conditions(tokens, mask, prompts, guided, prompt_kv=kv)
        ref, ref_uncond = _recomputed(model, tokens, mask, prompts, guided)
        assert_same64(z, ref, f"step {step}")
        if guided:
            assert_same64(z_uncond, ref_uncond, f"step {step}, unconditional")
        (cache,) = kv.values()
        width = prompts.both(model.tokenizer.pad_token_id)[0].shape[1] if guided else prompts.ids.shape[1]
        assert cache.get_seq_length() == width  # back to the prompt after every pass


@pytest.mark.kernels
def test_a_generation_with_the_prompt_cache_equals_one_without(pair64, monkeypatch):
    """Exactly in float64: the same tokens and the same decisions."""
    target, draft = pair64
    s, c = sampling64(num_steps=4, cfg_scale=2.0, head_steps=5), CSDConfig(gamma=2)
    cached = generate(target, PROMPTS, [3, 4], s)
    spec = speculative_generate(target, draft, PROMPTS, [3, 4], s, c)
    monkeypatch.setattr(Harmon, "conditions", _recomputed)
    assert_same64(cached.tokens, generate(target, PROMPTS, [3, 4], s).tokens, "target-only")
    plain = speculative_generate(target, draft, PROMPTS, [3, 4], s, c)
    assert_same64(spec.tokens, plain.tokens, "CSD")
    assert (spec.trace.maker == plain.trace.maker).all()


@pytest.mark.kernels
def test_csd_on_a_harmon_pair_shares_orders_and_traces_every_token(pair64):
    """In float64: pre-fill and image 0 alone are the same numbers up to float64 rounding."""
    target, draft = pair64
    s, c = sampling64(num_steps=8, cfg_scale=3.0), CSDConfig(gamma=3, prefill=0.2)
    spec = speculative_generate(target, draft, PROMPTS, [5, 6], s, c)
    base = generate(target, PROMPTS, [5, 6], s)
    t = spec.trace
    assert t.target_passes < base.trace.target_passes and t.draft_passes > 0
    made = {Maker.PREFILL, Maker.ACCEPTED, Maker.RESAMPLED, Maker.CAPPED}
    assert t.maker.shape == (2, target.seq_len) and set(t.maker.ravel().tolist()) <= made
    assert (t.maker != Maker.PREFILL).any() and (t.block >= 0).any()  # drafted blocks were verified
    # Pre-filled tokens come from the target with the same orders and noise as target-only.
    first = torch.from_numpy(t.maker == Maker.PREFILL)
    assert_same64(spec.tokens[first], base.tokens[first], "pre-fill")
    # Batch invariance of CSD too.
    alone = speculative_generate(target, draft, PROMPTS[:1], [5], s, c)
    assert_same64(alone.tokens[0], spec.tokens[0], "image 0 alone")
    assert (alone.trace.maker[0] == t.maker[0]).all()


@pytest.mark.kernels
def test_models_save_and_load_with_their_tokenizer(pair, tmp_path):
    """Every weight comes back bit for bit, so the tokens are the same: compared in float64."""
    target, _ = pair
    path = save_model(target, tmp_path / "m", {"note": "test"})
    again = load_model(path)
    assert isinstance(again, Harmon) and again.tokenizer.words == target.tokenizer.words
    saved, back = target.state_dict(), again.state_dict()
    assert saved.keys() == back.keys() and all(torch.equal(saved[k], back[k]) for k in saved)
    s, again64, target64 = sampling64(num_steps=2), at_precision(again, "float64"), at_precision(target, "float64")
    assert_same64(generate(again64, PROMPTS[:1], [0], s).tokens, generate(target64, PROMPTS[:1], [0], s).tokens)


def test_official_configs_are_the_published_sizes():
    small, large = harmon_config("harmon_0.5b"), harmon_config("harmon_1.5b")
    assert (small.llm["hidden_size"], small.llm["num_hidden_layers"], small.mar.encoder_embed_dim) == (896, 24, 768)
    assert (large.llm["hidden_size"], large.llm["num_hidden_layers"], large.mar.encoder_embed_dim) == (1536, 28, 1280)
    assert small.side == large.side == 32 and small.mar.seq_side == 16  # 512 px from a 256 px MAR
    assert small.null_prompt == "Generate an image." and "{input}" in small.template


def test_the_embedded_text_configs_keep_the_shipped_generators():
    assert TEXT_CONFIGS["shapes_text_target"].mar == mar_config("shapes_target")
    assert TEXT_CONFIGS["shapes_text_draft"].mar == mar_config("shapes_draft")
    assert all(c.llm["vocab_size"] == len(caption_tokenizer()) for c in TEXT_CONFIGS.values())


def test_the_text_trainer_starts_from_the_generator_and_learns(tmp_path, restore_threads):
    from csd.training.text_models import main

    out = tmp_path / "d"
    args = ["--config", "shapes_text_draft", "--out", str(out), "--steps", "3", "--batch-size", "4"]
    args += ["--data-size", "16", "--log-every", "1", "--threads", "1", "--warmup-steps", "0"]
    args += ["--init-generator", "assets/models/shapes_draft.safetensors", "--lr", "1e-3"]
    main(args)
    model = load_model(f"{out}.safetensors")
    generator = load_model("assets/models/shapes_draft.safetensors")
    assert isinstance(model, Harmon) and model.config == TEXT_CONFIGS["shapes_text_draft"]
    # Three steps from the shipped generator: close to it, not equal; proj_out has left zero.
    gap = (model.mar.z_proj.weight - generator.z_proj.weight).abs().max().item()
    assert 0 < gap < 0.05
    assert model.proj_out[2].weight.abs().max() > 0
    assert isinstance(model.tokenizer, WordTokenizer)


def test_the_text_trainer_gives_the_llm_and_projections_their_own_lr(tmp_path):
    from csd.training.text_models import TextTrainConfig, TextTrainer

    cfg = TextTrainConfig(
        config="shapes_text_draft", out=str(tmp_path / "d"), steps=2, batch_size=4, data_size=8, cond_lr_mult=4.0
    )
    trainer = TextTrainer(cfg)
    trainer.train_step()
    lrs = {}
    for g in trainer.optimizer.param_groups:
        for p in g["params"]:
            lrs[id(p)] = g["lr"]
    cond = {id(p) for m in (trainer.model.llm, trainer.model.proj_in, trainer.model.proj_out) for p in m.parameters()}
    rest = {id(p) for p in trainer.model.mar.parameters()}
    assert {lrs[i] for i in cond} == {4.0 * lrs[next(iter(rest))]} and len({lrs[i] for i in rest}) == 1
    with pytest.raises(ValueError, match="cond_lr_mult must be a finite number > 0"):
        TextTrainConfig(config="shapes_text_draft", out="x", cond_lr_mult=0.0)


# --- official checkpoints: the layout, on a tiny model -----------------------------------------------


def official_layout(tmp_path, model: Harmon):
    """A flat .pth of ``model`` and an LLM directory (config.json and a real word-level tokenizer)."""
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    torch.save(model.state_dict(), tmp_path / "harmon_tiny.pth")
    llm_dir = tmp_path / "Qwen-tiny"
    vocab = {w: i for i, w in enumerate(["<|endoftext|>", "<unk>", *CAPTION_WORDS])}
    inner = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    inner.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=inner, eos_token="<|endoftext|>", unk_token="<unk>")
    fast.save_pretrained(llm_dir)
    (llm_dir / "config.json").write_text(json.dumps(model.config.llm))  # no model_type: keep the word-level tokenizer
    return tmp_path / "harmon_tiny.pth", llm_dir


def test_an_official_layout_loads_strictly_with_its_llm_files(pair, tmp_path):
    from csd.models.harmon.official import load_official_harmon

    target, _ = pair
    pth, llm_dir = official_layout(tmp_path, target)
    loaded = load_official_harmon(pth, llm_dir, target.config)
    for k, v in target.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    assert loaded.tokenizer.encode("a red star") == [2 + CAPTION_WORDS.index(w) for w in ("a", "red", "star")]
    generate(loaded, PROMPTS[:1], [0], SamplingConfig(num_steps=2))  # the hub tokenizer drives a run


def test_official_loading_names_missing_files_and_mismatched_keys(pair, tmp_path):
    from csd.models.checkpoint import CheckpointError
    from csd.models.harmon.official import load_official_harmon

    target, _ = pair
    pth, llm_dir = official_layout(tmp_path, target)
    (llm_dir / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match=r"Qwen-tiny lacks tokenizer.json"):
        load_official_harmon(pth, llm_dir, target.config)
    pth, llm_dir = official_layout(tmp_path, target)
    state = torch.load(pth, weights_only=True)
    state["proj_in.9.weight"] = state.pop("proj_in.2.weight")
    torch.save(state, pth)
    with pytest.raises(
        CheckpointError, match=r"(?s)missing keys \(1\): proj_in.2.weight.*unexpected keys \(1\): proj_in.9"
    ):
        load_official_harmon(pth, llm_dir, target.config)
    with pytest.raises(CheckpointError, match="hidden_size 48 is not harmon_0.5b's \\(896\\): use the Qwen2.5-0.5B"):
        load_official_harmon(pth, llm_dir, "harmon_0.5b")
    with pytest.raises(CheckpointError, match="checkpoint file not found"):
        load_official_harmon(tmp_path / "nope.pth", llm_dir, target.config)


def test_prompt_scores_read_class_and_colour_from_real_images():
    from csd.shapes.text import prompt_scores

    data = make_dataset(60, seed=11)  # rendered images: both classifiers should name what the caption says
    scores = prompt_scores(data.images, data.captions)
    assert scores["class_accuracy"] >= 0.95 and scores["colour_accuracy"] >= 0.95
    wrong = [c.replace(c.split()[2], "red" if c.split()[2] != "red" else "blue", 1) for c in data.captions]
    assert prompt_scores(data.images, wrong)["colour_accuracy"] < 0.3  # asked for another colour


def test_the_benchmark_measures_a_text_pair_with_prompts(tmp_path, restore_threads):
    from csd.experiments.bench import main
    from tests.helpers import save_tiny_text_pair

    target, draft = save_tiny_text_pair(tmp_path)
    args = ["--quick", "--target", target, "--draft", draft, "--n", "4", "--n-ref", "20", "--repeats", "1"]
    args += ["--batches", "2", "--gammas", "2", "--num-steps", "4", "--threads", "1", "--out", str(tmp_path / "out")]
    result = main(args)
    q = result
    for key in ("target", "csd", "draft", "fewer"):
        assert 0 <= q[f"accuracy_{key}"] <= 1 and 0 <= q[f"colour_accuracy_{key}"] <= 1 and q[f"fd_{key}"] > 0
    assert 0 <= q["acceptance_aligned"] <= 1 and 0 <= q["acceptance_unaligned"] <= 1
    assert result["speedup"] > 0 and result["speedup_bound"] > 0


def test_a_text_model_continues_from_its_shipped_weights(tmp_path, restore_threads):
    from csd.training.text_models import main

    first = tmp_path / "a"
    common = ["--config", "shapes_text_draft", "--batch-size", "2", "--data-size", "8", "--threads", "1"]
    main([*common, "--out", str(first), "--steps", "1", "--init-generator", "assets/models/shapes_draft.safetensors"])
    second = tmp_path / "b"
    # Another seed: a fresh LLM would be initialised differently from a's.
    main([*common, "--out", str(second), "--steps", "1", "--seed", "1", "--init-generator", f"{first}.safetensors"])
    a, b = load_model(f"{first}.safetensors"), load_model(f"{second}.safetensors")
    gap = (a.llm.model.embed_tokens.weight - b.llm.model.embed_tokens.weight).abs().max().item()
    assert 0 < gap < 0.01  # b started from a's LLM (a fresh one would differ by far more)
