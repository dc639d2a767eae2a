"""scripts.gil_profile: the server's seconds per part of a py-spy profile, and the committed profiles of a burst
of 40 before and after the shared API schemas (bench/results/crowd/schemas/, docs/space.md) say what the
docs say of them."""

import json
from pathlib import Path

import pytest

from scripts.gil_profile import main, read_lines, server_seconds

ROOT = Path(__file__).resolve().parents[2]
RECORDS = ROOT / "bench" / "results" / "crowd" / "schemas"
CLIENT = 'process 1:"python -m scripts.crowd burst"'
SERVER = 'process 2:"python app.py --port 1"'


def test_only_the_servers_samples_count_each_in_every_part_its_stack_holds():
    lines = [
        f"{CLIENT};main (crowd.py:1) 50",  # the clients' process: not counted
        f"{CLIENT};{SERVER};run (csd/decoders/csd.py:1) 100",
        f"{CLIENT};{SERVER};postprocess_data (gradio/blocks.py:1);model_json_schema (pydantic/main.py:1) 25",
        f"{CLIENT};{SERVER};select (selectors.py:1) 5",
        "",
    ]
    assert server_seconds(lines, rate=50) == {"all": 2.6, "models": 2.0, "postprocess": 0.5, "api schemas": 0.5}


def test_the_committed_profiles_give_the_documented_seconds(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)  # the paths as the record gives them
    main([str((RECORDS / name).relative_to(ROOT)) for name in ("gil_prefix.txt.gz", "gil_fixed.txt.gz")])
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    committed = [json.loads(line) for line in (RECORDS / "gil.jsonl").read_text().splitlines()]
    assert printed == committed
    before, after = committed
    assert before["api schemas"] == pytest.approx(5.24) and after["api schemas"] == 0.0
    assert (before["postprocess"], after["postprocess"]) == pytest.approx((11.88, 5.08))
    assert len(read_lines(RECORDS / "gil_fixed.txt.gz")) > 1000
