"""The lesson page end to end: headless Debian Chromium (Python Playwright) opens /lesson, Pyodide starts in a Web
Worker from this server, every cell's output is compared with the same code run by CPython here (and the 5×5 and
d = 4 cells with attnlab's own numbers), a traceback is shown (and the last run's drawing goes), Stop ends an
infinite loop and only its own cell's run (printed lines stream in before it), editors fit their code, the torch
read-along runs on its button only and agrees, and quiz answers survive a reload. Every request that does not go
to 127.0.0.1 is aborted and recorded; none may be attempted.

One browser session for the whole module (Pyodide loads once, plus once more after Stop). Chromium is the system's
/usr/bin/chromium with the web-lab test's flags. Set ATTNLAB_LESSON_SCREENSHOT=docs/img/lesson.png to also save the
README's screenshot.
"""
from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import time
from pathlib import Path

import pytest
import torch
from live_server import CHROMIUM, CHROMIUM_ARGS, live_server

if not Path(CHROMIUM).is_file():
    pytest.skip(f"{CHROMIUM} is missing (the Makefile installs Debian's chromium package)", allow_module_level=True)
pytest.importorskip("fastapi", reason="the web lab needs fastapi")
pytest.importorskip("uvicorn", reason="the web lab needs uvicorn")
sync_api = pytest.importorskip("playwright.sync_api", reason="Python Playwright is not installed")

import attnlab  # noqa: E402
from attnlab.numpy_reference import self_attention  # noqa: E402
from attnlab.positional import sinusoidal  # noqa: E402
from attnlab.web import create_app  # noqa: E402
from attnlab.web.lesson import find_pyodide  # noqa: E402
from attnlab.web.readalong import PROGRAMS  # noqa: E402

if find_pyodide().dir is None:
    pytest.skip(f"Pyodide is not installed: {find_pyodide().problem}", allow_module_level=True)

TIMEOUT_MS = 30_000                     # a shared 2-core machine: generous, still bounded
READY_MS = 90_000                       # the bound for Pyodide to start
CELLS = ("attention", "positions", "order", "scaling")
NUMBER = re.compile(r"-?\d+\.\d+(?:e[+-]?\d+)?")


@pytest.fixture(scope="module")
def server():
    with live_server(create_app()) as base:
        yield base


@pytest.fixture(scope="module")
def page(server):
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 1000})
        attempted: list[str] = []
        routed: list[str] = []

        def local_only(route):                       # the page and its worker: only 127.0.0.1 is reachable
            url = route.request.url
            routed.append(url)
            if url.startswith((server + "/", "data:")):
                route.continue_()
            else:
                attempted.append(url)
                route.abort()

        context.route("**/*", local_only)
        context.on("request", lambda r: None if r.url.startswith((server + "/", "data:")) else attempted.append(r.url))
        posts: list[str] = []
        context.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)
        pg = context.new_page()
        pg.set_default_timeout(TIMEOUT_MS)
        start = time.monotonic()
        pg.goto(server + "/lesson")
        pg.wait_for_selector("body[data-python='ready']", timeout=READY_MS)
        pg.ready_seconds = time.monotonic() - start      # reported by test_python_starts_offline
        pg.routed = routed
        pg.posts = posts
        for cell in CELLS:
            _wait_runs(pg, cell, 1)
        yield pg
        browser.close()
        assert not attempted, f"the lesson tried to fetch from elsewhere: {attempted}"


def _wait_runs(page, cell: str, n: int) -> None:
    page.wait_for_selector(f"#cell-{cell}[data-runs='{n}']:not([data-state='running']):not([data-state='queued'])",
                           state="attached")


def _runs(page, cell: str) -> int:
    return int(page.get_attribute(f"#cell-{cell}", "data-runs"))


def _page_result(page, cell: str) -> tuple[str, dict]:
    stdout = page.text_content(f"#cell-{cell} .out .stdout")
    show = page.get_attribute(f"#cell-{cell}", "data-show")
    return stdout, json.loads(show)


def _cpython(code: str) -> tuple[str, dict]:
    """The cell's code run by this CPython, as the worker runs it: a fresh __main__ namespace."""
    out = io.StringIO()
    namespace = {"__name__": "__main__"}
    with contextlib.redirect_stdout(out):
        exec(compile(code, "<cell>", "exec"), namespace)
    return out.getvalue(), json.loads(json.dumps(namespace["show"]))


def _same_text(a: str, b: str) -> bool:
    """Equal, or equal up to one unit in the last printed digit of each number (libm may differ by an ulp)."""
    if a == b:
        return True
    na, nb = NUMBER.findall(a), NUMBER.findall(b)
    if NUMBER.sub("#", a) != NUMBER.sub("#", b) or len(na) != len(nb):
        return False
    for x, y in zip(na, nb):
        digits = len(x.split("e")[0].split(".")[1])
        if not math.isclose(float(x), float(y), rel_tol=1e-9, abs_tol=1.01 * 10 ** -digits):
            return False
    return True


def _close(a, b, tol=1e-9) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k], tol) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_close(x, y, tol) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(a, b, rel_tol=tol, abs_tol=tol)
    return a == b


def _matches_cpython(page, cell: str) -> tuple[str, dict]:
    stdout, show = _page_result(page, cell)
    want_out, want_show = _cpython(page.input_value(f"#code-{cell}"))
    assert _same_text(stdout, want_out), (cell, stdout, want_out)
    assert _close(show, want_show), cell
    return stdout, show


def test_python_starts_offline(page):
    assert page.ready_seconds * 1000 < READY_MS
    # the worker's own requests pass through the guard too (else a fetch from the worker would go unseen)
    assert any(u.endswith("/lesson/pyodide/pyodide.asm.wasm") for u in page.routed)
    assert any(u.endswith("/lesson/pyodide/python_stdlib.zip") for u in page.routed)
    assert re.search(r"Pyodide 314\.0\.8, Python 3\.\d+", page.text_content("#py-status"))
    assert page.is_hidden("#py-problem")


@pytest.mark.parametrize("cell", CELLS)
def test_cell_output_matches_cpython(page, cell):
    assert page.get_attribute(f"#cell-{cell}", "data-state") == "done"
    _matches_cpython(page, cell)


def test_attention_cell_matches_attnlab(page):
    _, show = _page_result(page, "attention")
    X, Wq, Wk, Wv = (torch.tensor(show[k], dtype=torch.float64) for k in ("X", "W_q", "W_k", "W_v"))
    q, k, v = (t[None, None] for t in (X @ Wq, X @ Wk, X @ Wv))                    # (1, 1, 5, 4)
    out, w = attnlab.attention(q, k, v, return_weights=True)
    assert torch.allclose(torch.tensor(show["weights"], dtype=torch.float64), w[0, 0], atol=1e-12)
    assert torch.allclose(torch.tensor(show["output"], dtype=torch.float64), out[0, 0], atol=1e-12)
    np_out, np_w = self_attention(X.numpy(), Wq.numpy(), Wk.numpy(), Wv.numpy())
    assert abs(np_w - w[0, 0].numpy()).max() < 1e-12 and abs(np_out - out[0, 0].numpy()).max() < 1e-12
    cells = page.locator("#cell-attention rect.cell")
    assert cells.count() == 25
    label = cells.nth(7).get_attribute("aria-label")                                # query 1, key 2
    assert f"{w[0, 0, 1, 2].item():.4f}" in label and "dog" in label and "bit" in label
    sums = page.locator("#cell-attention text.rowsum").all_text_contents()
    assert sums == ["1.0000"] * 5
    assert page.locator("#cell-attention .legend-bar").count() == 1


def test_positions_cell_matches_attnlab(page):
    _, show = _matches_cpython(page, "positions")
    want = sinusoidal(2, 4, dtype=torch.float64)
    assert torch.allclose(torch.tensor(show["table"], dtype=torch.float64), want, atol=1e-12)
    assert page.text_content("#cell-positions .stdout").splitlines()[1] == "PE(1) = (0.841, 0.540, 0.010, 1.000)"
    assert page.locator("#cell-positions tr.worked").count() == 2                    # the d = 4 example highlighted
    page.fill("#pe-d", "6")
    page.fill("#pe-positions", "0, 3, 50")
    page.click("#pe-apply")
    _wait_runs(page, "positions", 2)
    assert "positions = [0, 3, 50]" in page.input_value("#code-positions")
    _, show = _matches_cpython(page, "positions")
    want = sinusoidal(51, 6, dtype=torch.float64)[[0, 3, 50]]
    assert torch.allclose(torch.tensor(show["table"], dtype=torch.float64), want, atol=1e-12)
    assert page.locator("#cell-positions tr.worked").count() == 0


def test_order_cell_shows_what_positions_change(page):
    _, show = _page_result(page, "order")
    off, on = show["rows"]
    assert not off["positions"] and max(off["diff"].values()) < 1e-12               # order-blind without positions
    assert on["positions"] and min(on["diff"].values()) > 0.05
    assert page.locator("#cell-order td.same").count() == 3


def test_scaling_slider_reruns_the_cell(page):
    page.locator("#dk").fill("10")                                                  # d_k = 2^10
    _wait_runs(page, "scaling", 2)
    assert "d_k = 1024" in page.input_value("#code-scaling")
    assert page.text_content("#dk-value") == "1024"
    _, show = _matches_cpython(page, "scaling")
    big = show["sweep"][-1]
    assert show["d_k"] == 1024 and big["d_k"] == 1024
    assert big["entropy_unscaled"] < 0.5 * big["entropy_scaled"]                    # saturated without the scale
    assert big["gradient_unscaled"] < 1e-3 * big["gradient_scaled"]                 # and its gradient vanished
    assert page.locator("#cell-scaling svg.plot").count() == 4


def test_error_shows_the_traceback(page):
    page.fill("#code-attention", page.input_value("#code-attention") + "\nweights[0][0] / 0\n")
    page.click("#cell-attention button.run")
    _wait_runs(page, "attention", 2)
    assert page.get_attribute("#cell-attention", "data-state") == "error"
    tb = page.text_content("#cell-attention .traceback")
    assert "Traceback" in tb and "ZeroDivisionError" in tb and "weights[0][0] / 0" in tb
    page.click("#cell-attention button.reset")
    page.click("#cell-attention button.run")
    _wait_runs(page, "attention", 3)
    assert page.get_attribute("#cell-attention", "data-state") == "done"
    assert page.locator("#cell-attention .traceback").count() == 0


def test_an_error_removes_the_last_drawing(page):
    """A run that fails shows its traceback with no drawing of the run before it (the d = 4 table was left)."""
    n = _runs(page, "positions")
    assert page.locator("#cell-positions .viz table").count() > 0
    page.fill("#code-positions", page.input_value("#code-positions") + "\n1 / 0\n")
    page.click("#cell-positions button.run")
    _wait_runs(page, "positions", n + 1)
    assert page.get_attribute("#cell-positions", "data-state") == "error"
    assert "ZeroDivisionError" in page.text_content("#cell-positions .traceback")
    assert page.locator("#cell-positions .viz > *").count() == 0
    page.click("#cell-positions button.reset")
    page.click("#cell-positions button.run")
    _wait_runs(page, "positions", n + 2)
    assert page.locator("#cell-positions .viz table").count() > 0


def test_editors_fit_their_code(page):
    for cell in CELLS:                                  # each shipped cell whole, one spare row for the scrollbar
        lines = page.input_value(f"#code-{cell}").rstrip("\n").count("\n") + 1
        assert page.get_attribute(f"#code-{cell}", "rows") == str(lines + 1), cell
    page.fill("#code-order", "while True:\n    pass\n")
    assert page.get_attribute("#code-order", "rows") == "4"               # the minimum, not the shipped 53
    page.fill("#code-order", "x = 1\n" * 200)
    assert page.get_attribute("#code-order", "rows") == "60"              # the maximum: it scrolls inside
    page.click("#cell-order button.reset")
    assert page.get_attribute("#code-order", "rows") == "53"


def test_stop_ends_an_infinite_loop(page):
    """Stop ends its own cell's run only: a queued cell stays queued (and says so) and runs on the fresh worker;
    Stop on a queued cell takes it out of the queue and leaves the running one alone. What the loop printed before
    spinning is on the page while it spins, and stays after the Stop; the last run's drawing goes."""
    positions = _runs(page, "positions")
    page.fill("#code-order", "print('before the loop')\nn = 0\nwhile True:\n    n += 1\n")
    page.click("#cell-order button.run")
    page.wait_for_selector("#cell-order[data-state='running'] button.stop:not([disabled])")
    page.wait_for_selector("#cell-order .stdout:has-text('before the loop')", timeout=10_000)   # streamed
    time.sleep(1.0)                                   # it is really looping: the page stays responsive meanwhile
    assert page.get_attribute("#cell-order", "data-state") == "running"
    page.click("#cell-positions button.run")          # behind the loop: queued, and it says so
    page.wait_for_selector("#cell-positions[data-state='queued']", state="attached")
    assert "queued" in page.text_content("#cell-positions .state")
    page.click("#cell-positions button.stop")         # Stop on the queued cell: only it is stopped
    _wait_runs(page, "positions", positions + 1)
    assert page.get_attribute("#cell-positions", "data-state") == "stopped"
    assert page.get_attribute("#cell-order", "data-state") == "running"
    page.click("#cell-positions button.run")          # queued again; now Stop the loop
    page.wait_for_selector("#cell-positions[data-state='queued']", state="attached")
    page.click("#cell-order button.stop")
    _wait_runs(page, "order", 2)
    assert page.get_attribute("#cell-order", "data-state") == "stopped"
    assert "Stopped" in page.text_content("#cell-order .stopped")
    assert page.text_content("#cell-order .stdout") == "before the loop\n"
    assert page.locator("#cell-order .viz > *").count() == 0          # no table of the last run under the Stop
    assert page.get_attribute("#cell-positions", "data-state") in ("queued", "running")   # not ended with it
    page.wait_for_selector("body[data-python='ready']", timeout=READY_MS)
    _wait_runs(page, "positions", positions + 2)
    assert page.get_attribute("#cell-positions", "data-state") == "done"
    _matches_cpython(page, "positions")
    page.click("#cell-order button.reset")
    page.click("#cell-order button.run")              # waits for the fresh worker, then runs
    page.wait_for_selector("body[data-python='ready']", timeout=READY_MS)
    _wait_runs(page, "order", 3)
    assert page.get_attribute("#cell-order", "data-state") == "done"
    _matches_cpython(page, "order")


def test_readalong_runs_the_shown_code_and_agrees(page):
    # the page says it runs when the button is pressed: nothing ran on load
    assert page.get_attribute("#readalong-programs", "data-runs") == "0"
    assert not [u for u in page.posts if "/lesson/api/readalong" in u], page.posts
    assert set(page.locator("#readalong-programs pre.ra-out").all_text_contents()) == {"(not run yet)"}
    page.click("#readalong-run")
    page.wait_for_selector("#readalong-programs[data-runs='1']", state="attached")
    program = PROGRAMS["self-attention"]
    shown = page.locator("#readalong-self-attention pre.ra-code").all_text_contents()
    assert shown == [c.code for c in program.cells]
    assert float(page.get_attribute("#readalong-agreement", "data-max")) <= 1e-6
    assert "agree" in page.text_content("#readalong-agreement")
    outputs = page.locator("#readalong-self-attention pre.ra-out").all_text_contents()
    assert "max |difference|" in outputs[-1] and "(not run yet)" not in outputs


def test_a_hung_pyodide_load_times_out_with_a_message(page, server):
    context = page.context.browser.new_context()
    outside: list[str] = []

    def hang_wasm(route):                             # never answered: how a wrong MIME type looks to the page
        url = route.request.url
        if not url.startswith(server + "/"):
            outside.append(url)
            route.abort()
        elif not url.endswith("/pyodide.asm.wasm"):
            route.continue_()

    context.route("**/*", hang_wasm)
    try:
        pg = context.new_page()
        pg.goto(server + "/lesson?load_timeout=4")
        pg.wait_for_selector("body[data-python='failed']", timeout=TIMEOUT_MS)
        message = pg.text_content("#py-problem")
        assert "did not start within 4 s" in message and "application/wasm" in message
        assert pg.is_visible("#py-problem") and not outside
    finally:
        context.close()


@pytest.mark.skipif(not os.environ.get("ATTNLAB_LESSON_SCREENSHOT"), reason="set ATTNLAB_LESSON_SCREENSHOT=PATH")
def test_screenshot(page):
    out = Path(os.environ["ATTNLAB_LESSON_SCREENSHOT"])
    out.parent.mkdir(parents=True, exist_ok=True)
    page.set_viewport_size({"width": 1480, "height": 1000})      # wide: code and heatmap side by side
    page.click("#cell-attention button.run")
    _wait_runs(page, "attention", 4)
    page.evaluate("window.scrollTo(0, 0)")
    box = page.locator("#cell-attention").bounding_box()
    page.screenshot(path=str(out), clip={"x": 0, "y": 0, "width": 1480, "height": box["y"] + box["height"] + 16},
                    full_page=True)
    page.set_viewport_size({"width": 1280, "height": 1000})
    assert out.stat().st_size > 10_000


def test_quiz_feedback_is_kept_after_reload(page):        # last: the reload restarts the page's Python
    page.check("#q-advantage input[value='1']")
    page.click("#q-advantage button.check")
    page.check("#q-flops input[value='0']")                # the tempting wrong answer: fewer FLOPs
    page.click("#q-flops button.check")
    assert "Right" in page.text_content("#q-advantage .feedback.right")
    assert "critical path" in page.text_content("#q-flops .feedback.wrong")
    assert page.text_content("#quiz-score").startswith("2 of ")
    page.reload()
    page.wait_for_selector("#q-flops .feedback.wrong")
    assert page.is_checked("#q-advantage input[value='1']") and page.is_checked("#q-flops input[value='0']")
    assert "Right" in page.text_content("#q-advantage .feedback.right")
    assert re.match(r"2 of \d+ answered, 1 right", page.text_content("#quiz-score"))
    assert page.locator("fieldset.question").count() >= 9
