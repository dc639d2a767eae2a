"""The official pairs as a GPU Space serves them: the official layout fetched through the real Hub client (from
the Hub stand-in on 127.0.0.1, tests/fake_hub.py), MAR-L / MAR-B and MAR-H / MAR-B at 256 px through KL-16,
images decoded, the token map and the inspector on a 16 x 16 grid of 16-dim tokens, estimates from each pair's
own timing, every model run (KL-16 decodes included) in a GPU call. The weights are random and the models
tiny (scripts/random_official.py), the layout the official one."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("gradio_client")

from csd.serving.pairs import HUB_FILES, PairStore, discover, fetch_official, pair_specs
from demo import gpu, server
from demo.application import App
from demo.limits import Limits
from demo.tabs.generate import estimate_line
from scripts.random_official import TINY, tiny_configs, write_official
from tests.demo.browser import open_page, require_browser
from tests.demo.local_client import local_client
from tests.fake_hub import fake_hub
from tests.stubs import spaces as stub

pytestmark = pytest.mark.usefixtures("shared_rates")  # each pair timed once per session (tests/demo/conftest.py)
LIMITS = Limits(max_batch=2, max_steps=64, max_images=2)
RUN_TIMEOUT_MS = 120_000  # a tiny pair's run takes seconds; a stall fails in two minutes, with what the page shows
MAR_OFFICIAL = [s.name for s in pair_specs("official") if s.family == "mar"]  # H/B, L/B


@pytest.fixture(scope="module")
def official(tmp_path_factory):
    """A server on the official MAR pairs fetched from a Hub repository in the official layout (tiny, random
    weights), on ZeroGPU's side of the contract (the recording stand-in of spaces), timed as it starts."""
    source = tmp_path_factory.mktemp("hub_repo")
    checkpoints = tmp_path_factory.mktemp("checkpoints")
    with pytest.MonkeyPatch.context() as mp, tiny_configs():
        mp.setenv(gpu.ZERO_GPU_FLAG, "true")
        mp.setattr(gpu, "import_spaces", lambda: stub)
        write_official(source, TINY)
        repo = {name: (source / name).read_bytes() for name in HUB_FILES}
        with fake_hub({"org/mar-official": repo}) as (url, requests):
            fetch_official("org/mar-official", checkpoints, lambda line: None, endpoint=url)
        fetched = {
            r.split("/resolve/")[1].split("/", 1)[1] for r in requests if r.startswith("GET ") and "/resolve/" in r
        }
        assert fetched == set(HUB_FILES)  # every file downloaded through the Hub client
        stub.CALLS.clear()
        application = App(PairStore(discover(checkpoints, embedded_dir=source / "none"), torch.device("cpu")), LIMITS)
        application.idle_work()
        demo = server.build(application)
        url = server.serve(demo, LIMITS, "127.0.0.1", None, block=False)
        try:
            yield application, url
        finally:
            demo.close()


def controls(application: App, pair: str, **overrides) -> dict:
    return {**application.default_controls(), "pair_name": pair, "batch_size": 1, "ar_steps": 16, **overrides}


def test_the_pair_list_offers_the_official_mar_pairs_at_256_px_through_kl16(official):
    application, _ = official
    assert application.store.names == MAR_OFFICIAL
    for name in MAR_OFFICIAL:
        pair = application.store.get(name)
        assert pair.num_tokens == 256 and pair.target.token_dim == 16 and math.isqrt(pair.num_tokens) == 16
        assert pair.tokenizer.network and len(pair.class_names) == 1000
        assert application.timed(name)  # each pair's own timing, taken as the server started
        assert "Expected on this server" in estimate_line(application, **controls(application, name))
    assert [c["task"] for c in stub.CALLS][:2] == ["calibrate", "calibrate"]


def test_generate_and_inspect_decode_256_px_images_and_a_16_by_16_token_grid(official):
    application, url = official
    client = local_client(url)
    stub.CALLS.clear()
    values = controls(application, MAR_OFFICIAL[1])
    out = client.predict(**values, api_name="/generate")
    summary = out[-1] if isinstance(out[-1], dict) else next(o for o in out if isinstance(o, dict) and "speedup" in o)
    assert summary["pair"] == MAR_OFFICIAL[1]
    target = out[0]
    from PIL import Image

    with Image.open(target) as image:  # one 256 x 256 image (a grid of one)
        assert image.size == (256, 256)
    inspected = client.predict(image=0, row=15, column=15, **values, api_name="/inspect")
    assert len(inspected["frames"][0]["status"][0]) == 256 and inspected["token"]["index"] == 255
    with pytest.raises(Exception, match=r"Token row must be an integer in \[0, 15\] \(the 16 x 16 grid"):
        client.predict(image=0, row=16, column=0, **values, api_name="/inspect")
    assert {c["task"] for c in stub.CALLS} == {"compare", "inspect"}


@pytest.mark.browser
def test_an_official_pair_in_chromium_gallery_token_map_and_an_inspector_click(official):
    """Choose MAR-L / MAR-B, generate: the images and the token map of a 256 px run; in the Inspect tab a
    click on the status map opens the token under it, on the 16 x 16 grid; the replay's images are KL-16
    decodes, each in a GPU call."""
    require_browser()
    application, url = official
    stub.CALLS.clear()
    with open_page(url) as page:
        page.get_by_label("Model pair").first.click()
        page.get_by_role("option", name=MAR_OFFICIAL[1]).click()
        # The pair's change has landed (its card line names it) before Generate: a visitor sees it first too.
        page.wait_for_function(
            "name => (document.querySelector('#model-card')?.innerText || '').includes(name)", arg=MAR_OFFICIAL[1]
        )
        page.get_by_role("button", name="Generate", exact=True).click()
        try:
            page.wait_for_function(
                "() => { const t = document.querySelector('#gen-status')?.innerText || '';"
                " return t.includes('Speedup') && !t.includes('Precomputed'); }",
                timeout=RUN_TIMEOUT_MS,
            )
        except Exception as err:  # say what the page and the server show, not only that the wait ran out
            status = page.evaluate("() => document.querySelector('#gen-status')?.innerText")
            raise AssertionError(
                f"no result on the page: status {status!r}; runs {list(application.history)[-3:]}; GPU calls "
                f"{[c['task'] for c in stub.CALLS]}"
            ) from err
        for box in ("#img-target", "#img-csd", "#img-map", "#img-draft"):
            page.locator(f"{box} img").wait_for(state="visible")
        natural = page.evaluate("() => document.querySelector('#img-map img').naturalWidth")
        batch = application.default_controls()["batch_size"]
        assert natural >= 256 * min(batch, 2)  # 256 px images (upscaled for display when small)
        page.get_by_role("tab", name="Inspect").click()
        summary = page.locator("#token-summary")
        summary.get_by_text("Image", exact=False).first.wait_for(state="visible")
        status_map = page.locator("#replay-map img")
        status_map.wait_for(state="visible")
        width, height = page.evaluate(
            "() => { const i = document.querySelector('#replay-map img'); return [i.naturalWidth, i.naturalHeight]; }"
        )
        box = status_map.bounding_box()
        cols = math.ceil(math.sqrt(batch))
        side = (width - 4 * (cols - 1)) / cols  # display_grid: images of side px, 4 px apart
        x, y = (side - 2) * box["width"] / width, (side - 2) * box["height"] / height  # image 0's last token
        status_map.click(position={"x": x, "y": y})
        summary.get_by_text("Image 0, token (15, 15)", exact=False).wait_for(state="visible")
    tasks = [c["task"] for c in stub.CALLS]
    assert tasks[0] == "compare" and "decode" in tasks  # the KL-16 decodes of the replay, in GPU calls
