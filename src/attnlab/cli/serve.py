"""``attnlab serve``: the local web lab (``attnlab.web``) on http://127.0.0.1:PORT.

The server binds to the loopback interface only: the page runs models on request, so it must not
be reachable from the network. ``--host`` accepts only 127.0.0.1 or localhost, and the app
answers only those Host names (DNS-rebinding protection).

Example::

    attnlab serve --port 8000 --max-chars 300
"""
from __future__ import annotations

import argparse
import socket

from .util import fail

LOCAL_HOSTS = ("127.0.0.1", "localhost")


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _run_serve(args: argparse.Namespace) -> int:
    if args.host not in LOCAL_HOSTS:
        return fail(f"--host {args.host!r} refused: the lab serves only this machine ({' or '.join(LOCAL_HOSTS)}); "
                    "it runs models on request and has no authentication")
    if not 1 <= args.port <= 65535:
        return fail(f"--port must be in 1..65535, got {args.port}")
    if args.max_chars is not None and not 1 <= args.max_chars <= 100_000:
        return fail(f"--max-chars must be in 1..100000, got {args.max_chars}")
    try:
        import uvicorn

        from ..web import create_app
    except ImportError as e:
        return fail(f"the web lab needs fastapi and uvicorn ({e.name} is missing): pip install fastapi uvicorn")
    if not _port_free(args.port):
        return fail(f"port {args.port} on 127.0.0.1 is in use; pick another with --port")
    app = create_app() if args.max_chars is None else create_app(max_chars=args.max_chars)
    print(f"attnlab lab at http://127.0.0.1:{args.port}/  (Ctrl-C stops it)", flush=True)
    print(f"the lesson at http://127.0.0.1:{args.port}/lesson", flush=True)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level=args.log_level)
    return 0


def add_serve(sub) -> None:
    s = sub.add_parser("serve", help="the local web lab: attention maps you can explore in a browser",
                       description="Serve the attnlab lab on http://127.0.0.1:PORT: type a sentence, pick a model "
                                   "(minilm, toy-encoder, gpt-demo after `make demo`), a layer and a head; switch "
                                   "positional encoding off, change the 1/sqrt(d_k) scale, compare backends. "
                                   "Bound to 127.0.0.1 only.")
    s.add_argument("--port", type=int, default=8000, help="TCP port on 127.0.0.1 (default 8000)")
    s.add_argument("--host", default="127.0.0.1", help="127.0.0.1 or localhost; anything else is refused")
    s.add_argument("--max-chars", type=int, help="longest accepted text, in characters (default: the app's, "
                                                 "attnlab.web.DEFAULT_MAX_CHARS)")
    s.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn's log level (default warning)")
    s.set_defaults(run=_run_serve)
