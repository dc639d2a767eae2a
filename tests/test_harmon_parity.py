"""The project's Harmon reproduces the official implementation's numbers (wusize/Harmon, transformers 4.45.2).

tests/data/harmon_reference.pt was made by tests/data/make_harmon_reference.py from the official code on a
tiny random model: a 2-layer Qwen2 and a 4x4-grid MAR, a stand-in character tokenizer."""

from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from csd.chain import ChainNoise, HeadCondition, run_chain
from csd.models.harmon import Harmon, HarmonConfig, qwen2
from csd.models.mar import mar_config
from csd.models.mar.adapter import gather_rows
from csd.schedule import step_cfg_scales, step_sizes

REF = torch.load(Path(__file__).parent / "data" / "harmon_reference.pt", weights_only=True)
PROMPTS = ["a red star", "a small blue star on a gradient"]


class CharTokenizer:
    """The reference script's stand-in tokenizer: one id per character, padding with 1."""

    pad_token_id = 1

    def __len__(self) -> int:
        return 128

    def encode(self, text: str) -> list[int]:
        return [ord(c) % 120 + 2 for c in text]


@pytest.fixture(scope="module")
def model() -> Harmon:
    llm = qwen2(32, 2, 4, 2, 64, 128, max_position_embeddings=256, rope_theta=10000.0)
    m = Harmon(HarmonConfig(mar_config("mar_test"), llm), CharTokenizer(), attn_implementation="eager").eval()
    m.load_state_dict(REF["state"], strict=True)
    return m


def test_official_state_dict_loads_strictly(model):
    assert set(model.state_dict()) == set(REF["state"])
    assert {k.split(".")[0] for k in REF["state"]} == {"llm", "mar", "proj_in", "proj_out"}


def test_prompts_are_the_official_template_and_null_prompt(model):
    prompts = model.check_conditions(PROMPTS, 2, torch.device("cpu"))
    ids, attn = REF["input_ids"], REF["attention_mask"]
    for i in range(2):
        assert prompts.ids[i][prompts.attn[i]].tolist() == ids[i][attn[i]].tolist()
        assert prompts.null_ids[i][prompts.null_attn[i]].tolist() == ids[2 + i][attn[2 + i]].tolist()


@pytest.mark.parametrize("side", [4, 6])  # the model's grid, and a larger one with resized position embeddings
@pytest.mark.parametrize("known", ["masked", "half", "nearly"])
def test_conditions_match_the_official_encoder_llm_decoder(model, side, known):
    case = REF[f"z_{side}_{known}"]
    with torch.no_grad():
        z = model.backbone(case["tokens"], case["mask"], REF["input_ids"], REF["attention_mask"])
    torch.testing.assert_close(z, case["z"], rtol=1e-4, atol=1e-5)
    # The guided pass builds [prompts; null prompts] itself, padded to its own width: the same z.
    prompts = model.check_conditions(PROMPTS, 2, torch.device("cpu"))
    with torch.no_grad():
        z_c, z_u = model.conditions(case["tokens"][:2], case["mask"][:2], prompts, guided=True)
    torch.testing.assert_close(torch.cat([z_c, z_u]), case["z"], rtol=1e-4, atol=1e-5)


def test_head_network_output_matches_official(model):
    h = REF["head"]
    with torch.no_grad():
        out = model.head.net(h["x"], h["t"], h["z"])
    torch.testing.assert_close(out, h["out"], rtol=1e-4, atol=1e-5)


def test_a_whole_sampling_run_replays_the_official_one(model):
    """Orders and every noise draw of the official run, replayed step by step through the project's
    conditions, schedule, CFG ramp and head chain: the same tokens."""
    run = REF["run"]
    orders, n, steps = run["orders"], 16, run["num_iter"]
    sizes = step_sizes(n, steps)
    scales = step_cfg_scales(run["cfg"], run["cfg_schedule"], sizes)
    prompts = model.check_conditions(PROMPTS, 2, torch.device("cpu"))
    tokens = torch.zeros(2, n, 16)
    mask = torch.ones(2, n, dtype=torch.bool)
    masked = n
    for s, step in enumerate(run["steps"]):
        assert step["cfg"] == pytest.approx(scales[s], abs=1e-6)
        # Official: order[:masked_next] stays masked, so order[masked_next:masked] is predicted now.
        pos = orders[:, masked - sizes[s] : masked].sort(dim=1).values  # ascending, as nonzero() lists them
        masked -= sizes[s]
        with torch.no_grad():
            z_c, z_u = model.conditions(tokens, mask, prompts, guided=True)

        k = pos.numel()
        cond = HeadCondition(gather_rows(z_c, pos), gather_rows(z_u, pos), torch.full((k,), scales[s]))
        xi, *eps = step["draws"]
        noise = ChainNoise(xi, torch.stack([e[:k] for e in eps[:-1]]))  # the last draw is never used
        with torch.no_grad():
            x = run_chain(model.head.chain(None), cond, noise, run["temperature"]).x
        # rtol 5e-4: a whole guided run compounds float differences between CPUs (AVX-512 vs AVX2 kernels
        # differ by 1e-4 relative on one token in 192 here); a wrong step is off by far more.
        torch.testing.assert_close(x, step["x"][:k], rtol=5e-4, atol=1e-4)
        for i in range(2):
            tokens[i, pos[i]] = x.reshape(2, -1, 16)[i]
            mask[i, pos[i]] = False
    assert not mask.any()
    torch.testing.assert_close(tokens, run["tokens"], rtol=5e-4, atol=1e-4)
