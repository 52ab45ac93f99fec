"""The web lab's FastAPI app: a static page and a JSON API over ``attnlab.lab.inspect``.

    GET  /                 the page (static/index.html; its JS and CSS are served from the package)
    GET  /api/models       {models: [{name, description, layers, heads, available}], backends: [{name, exact}],
                            max_chars}
    POST /api/attention    {text, model, layer, head, positional, scale_factor, backend}
                        -> {model, n_layers, n_heads, backend, kernel (the backend that ran: auto's pick),
                            exact, tokens, layer, heads, weights (heads, L, L), entropy (per head, nats),
                            max_entropy (log L), agreement, positional, scale_factor}
    /lesson...             the lesson page, its Pyodide files and read-along (``web.lesson``; its own CSP)

Safety, because a browser tab on any site can reach 127.0.0.1: the server binds to 127.0.0.1
only (``attnlab serve``); the Host header must be one of ``allowed_hosts`` (400 otherwise: a
DNS-rebinding page arrives with its own host name); models are chosen by registered name, never
by path; the text is capped (413); the page loads nothing from other origins (a
Content-Security-Policy of 'self' says so to the browser). Every POST, the lab's and the lesson's,
passes ``web.guard.PostGuard`` first: it must come from the lab's own page (an ``Origin`` other than
``http://<Host>`` or a cross-site ``Sec-Fetch-Site`` is a 403, a body that is not ``application/json``
a 415); at most ``max_computing`` POSTs hold a slot (one more is a 429 with ``Retry-After``); and its
body is read whole before the route runs, capped in size (413) and in time (``body_timeout_s``, 408),
so a slow sender cannot hold a slot. The GET routes never wait for a computation (``list_models``
takes no lock), so the page stays responsive in a burst.

Errors are ``{"detail": message}``: 403 another site's request, 404 unknown model, 408 a body slower
than ``body_timeout_s``, 413 a body or text over the cap (bytes, characters or tokens), 415 not JSON,
422 empty text, unknown layer, head or backend, malformed JSON; 429 busy (Retry-After); 503 a
registered model whose files fail to load (e.g. a half-written runs/demo/gpt).

Example::

    from fastapi.testclient import TestClient
    client = TestClient(create_app(), base_url="http://127.0.0.1")
    client.post("/api/attention", json={"text": "the dog bit the man", "model": "toy-encoder"}).json()["tokens"]
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Optional, Sequence

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import MutableHeaders
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..lab.inspect import (InputTooLongError, ModelLoadError, UnknownModelError, attention_entropy, attention_maps,
                           backend_choices, list_models, registered_model)
from ..deprecation import renamed
from .guard import PostGuard
from .lesson import lesson_router

__all__ = ["create_app", "MapsRequest", "DEFAULT_MAX_CHARS", "DEFAULT_BODY_TIMEOUT_S", "STATIC_DIR"]

STATIC_DIR = Path(__file__).parent / "static"
DEFAULT_MAX_CHARS = 500            # a paragraph; the token cap (inspect.MAX_TOKENS) bounds the work too
DEFAULT_MAX_COMPUTING = 4          # POSTs in flight (receiving, running or queued for the model lock); more: 429
DEFAULT_BODY_TIMEOUT_S = 10.0      # a few KB from this machine take milliseconds; a trickle must not hold a slot
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'")


class MapsRequest(BaseModel):
    """POST /api/attention's body. Strict types: "1" is not a layer, 1 is not a boolean."""
    model_config = ConfigDict(extra="forbid", protected_namespaces=())
    text: str
    model: str = "toy-encoder"
    layer: StrictInt = 0
    head: Optional[StrictInt] = None          # None = every head of the layer
    positional: StrictBool = True
    scale_factor: float = 1.0
    backend: str = "auto"


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"detail": message}, status_code=status)


def _describe(e: ValidationError) -> str:
    err = e.errors()[0]
    where = ".".join(str(p) for p in err.get("loc", ())) or "body"
    return f"bad request: {where}: {err.get('msg', 'invalid')}"


def _kernel(loaded, backend: str, L: int, positional: bool) -> str:
    """The backend that ran: ``backend`` itself, or the one "auto" picks for this model's attention request
    (the same decision ``attention()`` makes: shape, dtype, causal, the positional bias)."""
    import torch

    from ..functional.api import choose_backend
    from ..functional.request import make_request
    a = loaded.attn_layers[0]
    w = a.q_proj.weight
    q = torch.zeros(1, a.cfg.n_heads, L, a.cfg.head_dim, dtype=w.dtype, device=w.device)   # (1, H, L, D)
    k = torch.zeros(1, a.cfg.kv_heads, L, a.cfg.head_dim, dtype=w.dtype, device=w.device)  # (1, Hkv, L, D)
    bias = a._bias(q, L, L) if positional else None
    req = make_request(q, k, k, causal=a.cfg.causal, bias=bias, scale=a.scale, return_weights=True)
    return choose_backend(req, backend).name


def _payload(maps, req: MapsRequest) -> dict:
    """The JSON answer (run in a worker thread: registered_model waits for the model lock)."""
    w = maps.weights[0]                                                       # (heads, L, L)
    L = len(maps.tokens)
    ent = attention_entropy(w).mean(-1)                                       # (heads,) mean over query rows
    exact = {b["name"]: b["exact"] for b in backend_choices()}[maps.backend]
    loaded = registered_model(maps.model)                                           # cached: the sizes for the page
    return dict(model=maps.model, n_layers=loaded.n_layers, n_heads=loaded.n_heads, backend=maps.backend,
                kernel=_kernel(loaded, maps.backend, L, req.positional), exact=exact, tokens=maps.tokens,
                layer=maps.layers[0],
                heads=maps.heads, weights=[[[round(v, 6) for v in row] for row in h] for h in w.tolist()],
                entropy=[round(float(e), 6) for e in ent], max_entropy=math.log(L) if L else 0.0,
                agreement=maps.agreement, positional=req.positional, scale_factor=req.scale_factor)


class SecurityHeaders:
    """ASGI middleware: the lab's CSP (unless a route set its own, as the lesson's do), nosniff, no-referrer.
    Plain ASGI rather than ``@app.middleware``: a request answered by nobody (the client left mid-body,
    ``web.guard``) passes through quietly instead of raising "No response returned"."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers.setdefault("Content-Security-Policy", CSP)
                headers["X-Content-Type-Options"] = "nosniff"
                headers["Referrer-Policy"] = "no-referrer"
            await send(message)

        await self.app(scope, receive, send_with_headers)


def create_app(max_chars: int = DEFAULT_MAX_CHARS,
               allowed_hosts: Sequence[str] = ("127.0.0.1", "localhost"),
               max_computing: int = DEFAULT_MAX_COMPUTING,
               body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S) -> FastAPI:
    """The lab's ASGI app. ``max_chars`` caps the text; ``allowed_hosts`` are the Host names answered;
    ``max_computing`` caps the POSTs (computations) in flight: one more is a 429 with Retry-After, while
    the GET routes (page, files, /api/models) never wait for a computation; ``body_timeout_s`` is how long
    a POST may take to send its whole body (later: 408, and its slot is freed).

    Example:
        uvicorn.run(create_app(max_chars=300), host="127.0.0.1", port=8000)
    """
    _check_settings(max_chars, allowed_hosts, max_computing, body_timeout_s)
    app = FastAPI(title="attnlab lab", docs_url=None, redoc_url=None, openapi_url=None)
    _guard(app, max_chars, allowed_hosts, max_computing, body_timeout_s)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    app.include_router(lesson_router())          # /lesson: the page that teaches self-attention (web.lesson)
    _lab_routes(app, max_chars)
    return app


def _check_settings(max_chars, allowed_hosts, max_computing, body_timeout_s) -> None:
    """ValueError naming the setting and its value, for each of create_app's arguments."""
    if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 1:
        raise ValueError(f"max_chars must be a positive int, got {max_chars!r}")
    if isinstance(allowed_hosts, str) or not allowed_hosts or "*" in allowed_hosts:
        raise ValueError(f"allowed_hosts must be a list of host names without '*', got {allowed_hosts!r}")
    if isinstance(max_computing, bool) or not isinstance(max_computing, int) or max_computing < 1:
        raise ValueError(f"max_computing must be a positive int, got {max_computing!r}")
    if isinstance(body_timeout_s, bool) or not isinstance(body_timeout_s, (int, float)) \
            or not 0 < body_timeout_s < math.inf:
        raise ValueError(f"body_timeout_s must be a positive number of seconds, got {body_timeout_s!r}")


def _guard(app: FastAPI, max_chars: int, allowed_hosts: Sequence[str], max_computing: int,
           body_timeout_s: float) -> None:
    """The middleware, outermost last: security headers, then the Host check, then the POST guard."""
    body_limit = 4 * max_chars + 4096        # JSON escapes and the other fields: generous, still bounded
    # Added before the Host check, so it runs after it: a foreign Host is a 400 before any body is read.
    app.add_middleware(PostGuard, max_computing=max_computing, body_limit=body_limit, body_timeout_s=body_timeout_s,
                       too_large=f"the text is capped at {max_chars} characters")
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts))
    app.add_middleware(SecurityHeaders)      # last added, so outermost: every answer carries them


def _lab_routes(app: FastAPI, max_chars: int) -> None:
    """GET / (the page), GET /api/models and POST /api/attention (module docstring)."""

    @app.get("/", include_in_schema=False)
    async def index():
        return FileResponse(STATIC_DIR / "index.html", media_type="text/html")

    @app.get("/api/models")
    async def models():                      # list_models never waits for the model lock (inspect.py)
        return dict(models=list_models(), backends=backend_choices(), max_chars=max_chars)

    @app.post("/api/attention")
    async def attention(request: Request):
        try:                                 # the guard has read the body already, under its caps
            req = MapsRequest.model_validate_json(await request.body())
        except ValidationError as e:
            return _error(422, _describe(e))
        refusal = _refusal(req, max_chars)
        if refusal is not None:
            return refusal
        try:
            maps = await run_in_threadpool(attention_maps, req.model, req.text, layer=req.layer, head=req.head,
                                           positional=req.positional, scale_factor=req.scale_factor,
                                           backend=req.backend)
        except UnknownModelError as e:
            return _error(404, str(e))
        except InputTooLongError as e:
            return _error(413, str(e))
        except ModelLoadError as e:
            return _error(503, str(e))
        except (ValueError, TypeError) as e:
            return _error(422, str(e))
        return await run_in_threadpool(_payload, maps, req)


def _refusal(req: MapsRequest, max_chars: int) -> Optional[JSONResponse]:
    """The error answer for a well-formed body the lab will not compute (empty or long text, unknown
    backend), or None."""
    if not req.text.strip():
        return _error(422, "the text is empty: type a sentence to see its attention")
    if len(req.text) > max_chars:
        return _error(413, f"the text is {len(req.text)} characters, over the cap of {max_chars}; shorten it")
    names = [b["name"] for b in backend_choices()]
    if req.backend not in names:
        return _error(422, f"unknown backend {req.backend!r}; choose from {names}")
    return None


# MapsRequest was AttentionRequest until issue #29: functional.request.AttentionRequest is the kernels' request.
__getattr__ = renamed(globals(), {"AttentionRequest": "MapsRequest"}, __name__)
