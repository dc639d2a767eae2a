"""A server's estimates from its start: each shipped pair's committed rates (demo/reference.py), used only for the
weights and setting they were timed at, scaled by the pair's probe here, and refined by what its requests took."""

from __future__ import annotations

import json

import pytest
import torch

import demo.application
from csd.serving.pairs import RANDOM_SOURCE, PairStore, discover
from demo import gpu, precompute, reference, server
from demo.application import App
from demo.estimate import Rates
from demo.limits import Limits
from demo.timings import FACTOR_RANGE
from tests.demo.slow_pair import slowed

PER_STEP = {"target": 0.01, "draft": 0.002, "csd": 0.006}


def served(application: App) -> dict[str, tuple[str, str]]:
    return {n: (application.store.source(n).weights, application.default_setting(n)) for n in application.store.names}


def write(path, application: App, weights: str | None = None) -> None:
    """A committed file for the application's pairs (``weights``: other weights than the served ones)."""
    entry = lambda n: {
        "weights": weights or application.store.source(n).weights,
        "setting": application.default_setting(n),
        "rates": {"one": PER_STEP, "many": PER_STEP, "batch": 4, "passes": None, "tokens": 0},
        "probe_s": 0.5,
    }
    path.write_text(json.dumps({"pairs": {n: entry(n) for n in application.store.names}}))


def test_the_committed_rates_hold_for_every_pair_a_server_offers_by_default():
    """Regenerated with the weights and the page's defaults (python -m demo.precompute --rates): a stale file
    would leave a shipped pair to be timed while its first visitors wait."""
    application = App(PairStore([*discover(None), RANDOM_SOURCE], torch.device("cpu")), Limits())
    committed = reference.read(reference.REFERENCE_FILE, served(application))
    assert committed is not None and sorted(committed.rates) == sorted(application.store.names)
    assert all(seconds > 0 for seconds in committed.probes.values())


def test_committed_rates_hold_only_for_the_weights_and_setting_they_were_timed_at(tmp_path):
    application = App(PairStore([RANDOM_SOURCE], torch.device("cpu")), Limits())
    write(tmp_path / "same.json", application)
    assert sorted(reference.read(tmp_path / "same.json", served(application)).rates) == [RANDOM_SOURCE.name]
    write(tmp_path / "other.json", application, weights="sha256:other")
    assert reference.read(tmp_path / "other.json", served(application)) is None
    other_setting = App(PairStore([RANDOM_SOURCE], torch.device("cpu")), Limits(max_steps=4))  # fewer AR steps
    assert reference.read(tmp_path / "same.json", served(other_setting)) is None
    assert reference.read(tmp_path / "none.json", served(application)) is None


def test_a_committed_pair_has_estimates_at_once_and_its_probe_scales_them(tmp_path, monkeypatch):
    """Nothing runs before the first estimate; the server's probe (its own work) scales the pair's rates by its
    seconds here over the reference's."""
    application = App(PairStore([RANDOM_SOURCE], torch.device("cpu")), Limits())
    write(tmp_path / "rates.json", application)
    application.timings.reference = reference.read(tmp_path / "rates.json", served(application))
    ran = []
    monkeypatch.setattr(demo.application, "calibrate", lambda *args: ran.append("calibrate"))
    monkeypatch.setattr(demo.application, "probe", lambda *args: ran.append("probe") or 1.5)
    pair = application.store.get(RANDOM_SOURCE.name)
    assert application.timed(RANDOM_SOURCE.name) and application.rates(pair).one == PER_STEP and ran == []
    log: list[str] = []
    application.idle_work(log.append)
    assert ran == ["probe"] and application.timings.scale == {RANDOM_SOURCE.name: 3.0}
    assert application.rates(pair).one == pytest.approx({k: 3 * v for k, v in PER_STEP.items()})
    assert log == [f"Probed {RANDOM_SOURCE.name} in 0 s: 3.00x the reference machine's time"]


def test_a_pair_missing_from_the_committed_file_is_timed_while_the_line_is_empty_the_others_only_probed(
    tmp_path, monkeypatch
):
    """A pair the file does not hold (a pair added after the file was written) has no estimate until the server
    times it, which it does, like the probes, only while its line is empty; the committed pairs are not timed."""
    twin = slowed("twin")
    application = App(PairStore([RANDOM_SOURCE, twin], torch.device("cpu")), Limits())
    committed_only = App(PairStore([RANDOM_SOURCE], torch.device("cpu")), Limits())
    write(tmp_path / "rates.json", committed_only)
    application.timings.reference = reference.read(tmp_path / "rates.json", served(application))
    ran = []
    monkeypatch.setattr(
        demo.application, "calibrate", lambda pair, *args: ran.append(pair.name) or Rates(PER_STEP, PER_STEP)
    )
    monkeypatch.setattr(demo.application, "probe", lambda pair, *args: ran.append(f"probe {pair.name}") or 0.5)
    assert application.timed(RANDOM_SOURCE.name) and not application.timed(twin.name)
    assert application.timings.missing() == [twin.name] and ran == []
    log: list[str] = []
    application.idle_work(log.append)
    assert ran == [f"probe {RANDOM_SOURCE.name}", twin.name] and application.timings.missing() == []
    assert application.timings.committed(RANDOM_SOURCE.name) and not application.timings.committed(twin.name)
    assert [line.split(" in ")[0] for line in log] == [f"Probed {RANDOM_SOURCE.name}", f"Timed {twin.name}"]


def test_the_rates_command_writes_a_file_the_server_reads_at_its_page_defaults(tmp_path, monkeypatch):
    """``python -m demo.precompute --rates`` (here on the untrained pair alone, the embedded ones left out):
    what it writes holds for the pairs of a server made afterwards, keyed by the same weights and setting."""
    monkeypatch.setattr(precompute, "discover", lambda checkpoints: [])
    threads = torch.get_num_threads()
    try:
        precompute.main(["--rates", "--out", str(tmp_path / "rates.json")])
    finally:
        torch.set_num_threads(threads)  # the command sets one thread
    written = json.loads((tmp_path / "rates.json").read_text())
    assert list(written["pairs"]) == [RANDOM_SOURCE.name] and written["machine"]["threads"] == 1
    application = App(PairStore([RANDOM_SOURCE], torch.device("cpu")), Limits())
    committed = reference.read(tmp_path / "rates.json", served(application))
    assert committed is not None and committed.probes[RANDOM_SOURCE.name] > 0
    assert committed.rates[RANDOM_SOURCE.name].one["target"] > 0


def test_the_server_reads_the_committed_rates_on_a_cpu_and_times_its_pairs_on_zero_gpu(monkeypatch):
    on_cpu = server.make_app(None, Limits())
    assert all(on_cpu.timings.committed(name) for name in on_cpu.store.names)
    monkeypatch.setenv(gpu.ZERO_GPU_FLAG, "true")
    assert server.make_app(None, Limits()).timings.reference is None


def test_what_a_requests_runs_took_moves_its_pairs_estimates_halfway_on_a_log_scale():
    application = App(PairStore([RANDOM_SOURCE], torch.device("cpu")), Limits())
    application.timings.known[RANDOM_SOURCE.name] = Rates(PER_STEP, PER_STEP)
    r = application.request(None, True, **application.default_controls())
    before = application.estimate(r, {"target": 1})
    application.timings.observe(RANDOM_SOURCE.name, before, 4 * before)  # took four times its estimate
    assert application.estimate(r, {"target": 1}) == pytest.approx(2 * before)
    application.timings.observe(RANDOM_SOURCE.name, 1.0, 1e6)  # one request moves it by at most 4x, halved
    assert application.timings.factor[RANDOM_SOURCE.name] == pytest.approx(FACTOR_RANGE[1])
    application.timings.observe(RANDOM_SOURCE.name, 1.0, 0.0)  # a request that did not run: nothing learned
    assert application.timings.factor[RANDOM_SOURCE.name] == pytest.approx(FACTOR_RANGE[1])
