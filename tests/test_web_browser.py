"""The web lab end to end: headless Debian Chromium (driven by Python Playwright) loads the page, submits a
sentence, and finds the heatmap drawn with L*L cells; errors from the API appear on the page.

Chromium is the system's /usr/bin/chromium (the Makefile installs Debian's package where it is missing);
never `playwright install`. Set ATTNLAB_WEB_SCREENSHOT=docs/img/web-lab.png to also save a screenshot
of the page showing MiniLM's attention (how docs/img/web-lab.png is made).
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from live_server import CHROMIUM, CHROMIUM_ARGS, live_server

if not Path(CHROMIUM).is_file():
    pytest.skip(f"{CHROMIUM} is missing (the Makefile installs Debian's chromium package)", allow_module_level=True)
pytest.importorskip("fastapi", reason="the web lab needs fastapi")
pytest.importorskip("uvicorn", reason="the web lab needs uvicorn")
sync_api = pytest.importorskip("playwright.sync_api", reason="Python Playwright is not installed")

from attnlab.lab.inspect import list_models  # noqa: E402
from attnlab.web import create_app  # noqa: E402

TIMEOUT_MS = 20_000                     # a shared 2-core machine: generous, still bounded


@pytest.fixture(scope="module")
def server():
    with live_server(create_app(max_chars=200)) as url:
        yield url


@pytest.fixture(scope="module")
def page(server):
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        pg = browser.new_page(viewport={"width": 1280, "height": 1000})
        pg.set_default_timeout(TIMEOUT_MS)
        outside: list[str] = []
        pg.on("request", lambda req: None if req.url.startswith((server, "data:")) else outside.append(req.url))
        pg.goto(server + "/")
        pg.wait_for_selector("body[data-ready='1']")
        yield pg
        browser.close()
        assert not outside, f"the page fetched from elsewhere: {outside}"


def _show(page, text: str, model: str = "toy-encoder") -> None:
    page.select_option("#model", model)
    page.fill("#text", text)
    page.click("#run")


def test_submit_draws_the_heatmap(page):
    _show(page, "the dog bit the man")
    page.wait_for_selector("#heatmap[data-cells='25']")
    assert page.locator("#heatmap rect.cell").count() == 25             # one cell per (query, key)
    assert page.locator("#heatmap text.qlabel").all_text_contents() == ["the", "dog", "bit", "the", "man"]
    assert page.locator("#heads .thumb").count() == 4                     # toy-encoder: 4 heads per layer
    assert page.locator("#headview line.link").count() > 0
    assert "max |Δ| vs reference" in page.text_content("#agreement")
    assert page.is_hidden("#error")


def test_longer_sentence_and_head_switch(page):
    _show(page, "a b c d e f g")
    page.wait_for_selector("#heatmap[data-cells='49']")
    assert page.locator("#heatmap rect.cell").count() == 49
    first = page.get_attribute("#heatmap rect.cell >> nth=1", "fill")
    page.select_option("#head", "3")
    page.wait_for_selector("#status:has-text('head 3')")     # (wait_for_function would need CSP's unsafe-eval)
    assert page.locator("#heatmap rect.cell").count() == 49
    assert page.get_attribute("#heatmap rect.cell >> nth=1", "fill") != first


def _entropy(page) -> float:
    return float(page.text_content("#entropy").split()[1])


def test_knobs_rerun_the_model(page):
    _show(page, "the dog bit the man")
    page.select_option("#head", "0")
    page.wait_for_selector("#status:has-text('head 0 · 5 tokens · scale ×1')")
    base = _entropy(page)
    page.locator("#scale").fill("3")                                    # 2^3: scores x8, a saturated softmax
    page.wait_for_selector("#status:has-text('scale ×8')")
    assert _entropy(page) < base
    page.uncheck("#positional")
    page.wait_for_selector("#status:has-text('positions off')")
    page.select_option("#backend", "tiled")
    page.wait_for_selector("#agreement:has-text('backend: tiled')")
    assert float(page.text_content("#agreement").split("= ")[1]) < 1e-5
    page.check("#positional")
    page.locator("#scale").fill("0")
    page.select_option("#backend", "auto")
    page.wait_for_selector("#agreement:has-text('backend: auto')")


def test_empty_text_shows_the_api_message(page):
    _show(page, "")
    page.wait_for_selector("#error:not([hidden])")
    assert "empty" in page.text_content("#error")
    _show(page, "the man bit the dog")                                   # recovers: error hidden again
    page.wait_for_selector("#error", state="hidden")


def test_text_over_the_cap_shows_the_message(page):
    page.evaluate("document.querySelector('#text').removeAttribute('maxlength')")
    _show(page, "word " * 60)
    page.wait_for_selector("#error:not([hidden])")
    assert "over the cap" in page.text_content("#error")


@pytest.mark.skipif(not os.environ.get("ATTNLAB_WEB_SCREENSHOT"), reason="set ATTNLAB_WEB_SCREENSHOT=PATH to save one")
def test_screenshot(page):
    available = {m["name"] for m in list_models() if m["available"]}
    model = "minilm" if "minilm" in available else "toy-encoder"
    page.select_option("#model", model)
    page.select_option("#layer", "5" if model == "minilm" else "0")     # MiniLM layer 5, head 4: "sat" -> "award"
    _show(page, "The award, which was given for lifetime achievement, sat proudly on the shelf", model)
    page.wait_for_selector("#heatmap rect.cell >> nth=100")
    page.select_option("#head", "4" if model == "minilm" else "0")
    page.wait_for_selector("#status:has-text('layer 5 · head 4')" if model == "minilm"
                           else "#status:has-text('head 0')")
    out = Path(os.environ["ATTNLAB_WEB_SCREENSHOT"])
    out.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(out), full_page=True)
    assert out.stat().st_size > 10_000


# -- issue #18: the colour scale, the kernel that ran, a phone-width window, a pinned row, positions side by side --
def test_legend_discloses_the_sqrt_colour_scale(page):
    _show(page, "the dog bit the man")
    page.wait_for_selector("#heatmap[data-cells='25']")
    assert page.locator("#legend rect.swatch").count() >= 20
    assert page.locator("#legend text.tick").all_text_contents() == ["0", "0.01", "0.1", "0.25", "0.5", "1"]
    assert "√weight" in page.text_content("#legend")
    # the legend's colours are the heatmap's: weight 1 at the right end is the darkest cell colour there is
    last = page.get_attribute("#legend rect.swatch >> nth=-1", "fill")
    first = page.get_attribute("#legend rect.swatch >> nth=0", "fill")
    assert last != first and last.startswith("rgb(") and first.startswith("rgb(")


def test_status_names_the_kernel_that_ran(page):
    _show(page, "the man bit the dog")
    page.wait_for_selector("#heatmap[data-cells='25']")
    page.select_option("#backend", "auto")
    page.wait_for_selector("#status:has-text('kernel sdpa')")              # no mask, no bias: SDPA's flash kernel
    assert "backend: auto → sdpa" in page.text_content("#agreement")
    page.select_option("#backend", "tiled")
    page.wait_for_selector("#status:has-text('kernel tiled')")
    page.select_option("#backend", "auto")
    page.wait_for_selector("#status:has-text('kernel sdpa')")


def test_click_a_token_to_highlight_its_row(page):
    _show(page, "the dog bit the man")
    # the previous test left a 5-token map too ("the man bit the dog"): wait for this sentence's, or the pin
    # would land on the old map and be cleared when the new tokens arrive
    sync_api.expect(page.locator("#heatmap text.qlabel").nth(1)).to_have_text("dog", timeout=TIMEOUT_MS)
    page.click("#heatmap text.qlabel >> nth=2")                            # "bit"
    page.wait_for_selector("#heatmap text.qlabel.pinned")
    assert page.locator("#heatmap rect.cell.dim").count() == 20          # every row but "bit"'s dims
    assert page.locator("#heatmap rect.cell[data-q='2']:not(.dim)").count() == 5
    page.click("#heatmap text.qlabel >> nth=2")                            # a second click unpins
    page.wait_for_selector("#heatmap text.qlabel.pinned", state="detached")
    assert page.locator("#heatmap rect.cell.dim").count() == 0


def test_positions_on_and_off_side_by_side(page):
    _show(page, "the dog bit the man")
    page.wait_for_selector("#heatmap[data-cells='25']")
    page.check("#compare")
    page.wait_for_selector("#heatmap-off[data-cells='25']")
    assert page.is_visible("#compare-figure")
    on = page.get_attribute("#heatmap rect.cell >> nth=1", "fill")
    assert on != page.get_attribute("#heatmap-off rect.cell >> nth=1", "fill")   # the toy encoder uses positions
    page.uncheck("#compare")
    page.wait_for_selector("#compare-figure", state="hidden")


def test_narrow_window_does_not_overflow(page, server):
    """At 420 px (a phone) the page never scrolls sideways: the heatmap scales down inside its figure."""
    pg = page.context.browser.new_page(viewport={"width": 420, "height": 900})
    try:
        pg.set_default_timeout(TIMEOUT_MS)
        pg.goto(server + "/")
        pg.wait_for_selector("body[data-ready='1']")
        _show(pg, "The award, which was given for lifetime achievement, sat proudly on the shelf")
        pg.wait_for_selector("#heatmap[data-cells='225']")                  # 15 word tokens
        page_width = pg.evaluate("document.documentElement.scrollWidth")
        assert page_width <= 420, page_width
        for sel in ("#heatmap", "#legend", "#headview", "#controls"):
            box = pg.locator(sel).bounding_box()
            assert box["x"] >= 0 and box["x"] + box["width"] <= 420 + 0.5, (sel, box)
        shot = os.environ.get("ATTNLAB_WEB_SCREENSHOT")
        if shot:
            out = Path(shot).with_name(Path(shot).stem + "-narrow.png")
            pg.screenshot(path=str(out), full_page=True)
    finally:
        pg.close()


# -- issue #28: the lab opens on the README's head, not on layer 0 head 0 --
def test_the_lab_opens_on_the_readme_example(page, server):
    """README: `attnlab show --model minilm ... --layer 5 --head 4`; the lab opens there (a model without that head:
    its last layer, head 0), and a freshly picked model opens on its own start view."""
    first = next(m for m in list_models() if m["available"])
    want = ("5", "4") if first["layers"] > 5 and first["heads"] > 4 else (str(first["layers"] - 1), "0")
    if first["name"] == "minilm":
        readme = (Path(__file__).parents[1] / "README.md").read_text()
        assert "--model minilm" in readme and "--layer 5 --head 4" in readme and "layer 5, head 4" in readme
    pg = page.context.browser.new_page(viewport={"width": 1280, "height": 1000})
    try:
        pg.set_default_timeout(TIMEOUT_MS)
        pg.goto(server + "/")
        pg.wait_for_selector("body[data-ready='1']")
        assert pg.input_value("#model") == first["name"]
        assert (pg.input_value("#layer"), pg.input_value("#head")) == want
        pg.click("#run")
        pg.wait_for_selector(f"#status:has-text('layer {want[0]} · head {want[1]} ·')", timeout=60_000)
        pg.select_option("#model", "toy-encoder")                             # 2 layers x 4 heads: no head 5.4
        assert (pg.input_value("#layer"), pg.input_value("#head")) == ("1", "0")
    finally:
        pg.close()
