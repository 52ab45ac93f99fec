"""A real uvicorn server on a free 127.0.0.1 port, in a thread, and the Chromium the browser tests drive.

Example::

    with live_server(create_app()) as base:          # "http://127.0.0.1:PORT"
        page.goto(base + "/lesson")
"""
from __future__ import annotations

import contextlib
import threading
import time

import pytest

from attnlab.train.distributed import free_port

CHROMIUM = "/usr/bin/chromium"            # Debian's package (the Makefile installs it); never `playwright install`
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


@contextlib.contextmanager
def live_server(app, start_timeout: float = 20.0, **config):
    """``config``: more uvicorn.Config options (e.g. ``log_config=None``, so its error log reaches caplog)."""
    import uvicorn

    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **config))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout
    while not srv.started:
        if time.monotonic() > deadline or not thread.is_alive():
            pytest.fail(f"uvicorn did not start within {start_timeout:.0f} s")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(timeout=10)
