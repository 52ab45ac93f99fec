"""The lesson page's routes: self-attention taught with Python that runs in the browser (Pyodide), offline.

    GET  /lesson                       the page (lesson/lesson.html)
    GET  /lesson/static/{name}         its JS modules and CSS (only the files in lesson/)
    GET  /lesson/pyodide/{name}        the five Pyodide files (.wasm as application/wasm, .mjs as text/javascript)
    GET  /lesson/api/pyodide           {found, version, dir, problem}: the page's message when Pyodide is missing
    GET  /lesson/api/readalong         {programs: {name: {title, cells: [{title, code}]}}}
    POST /lesson/api/readalong/{name}  runs that fixed program with the local torch (``web.readalong``); 404 unknown;
                                       its body is ignored (in ``create_app`` the POST guard caps it: 413, 408)

Where the Pyodide files come from (nothing is fetched from the internet, ever): the first of

1. ``$ATTNLAB_PYODIDE_DIR`` when set (a folder holding the five files, e.g. ``node_modules/pyodide``);
2. ``node_modules/pyodide`` at the root of the source checkout this package was imported from
   (``npm ci`` there; ``make setup`` runs it);
3. ``node_modules/pyodide`` in the working directory (a wheel user: ``npm install pyodide@314.0.8``).

When none holds all five files, the page and the serve log say so and name those commands.

The page needs 'wasm-unsafe-eval' in its Content-Security-Policy (compiling WebAssembly), and nothing
else beyond the lab's 'self'; its responses carry ``LESSON_CSP``, which the app's middleware keeps.

Example::

    app.include_router(lesson_router())            # in web.app.create_app
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from fastapi import APIRouter
from fastapi.responses import FileResponse, JSONResponse
from starlette.concurrency import run_in_threadpool

from .readalong import PROGRAMS, describe_programs, run_program

__all__ = ["lesson_router", "find_pyodide", "PyodideFiles", "LESSON_DIR", "LESSON_CSP", "PYODIDE_VERSION",
           "PYODIDE_FILES", "PYODIDE_ENV", "INSTALL_HINT"]

log = logging.getLogger("attnlab.web")

LESSON_DIR = Path(__file__).parent / "lesson"
PYODIDE_VERSION = "314.0.8"                 # pinned in package.json / package-lock.json at the repo root
PYODIDE_ENV = "ATTNLAB_PYODIDE_DIR"
PYODIDE_FILES = ("pyodide.mjs", "pyodide.asm.mjs", "pyodide.asm.wasm", "python_stdlib.zip", "pyodide-lock.json")
INSTALL_HINT = (f"run `npm ci` in the attnlab source checkout (make setup does it), or "
                f"`npm install pyodide@{PYODIDE_VERSION}` in the folder you start `attnlab serve` from, "
                f"or set {PYODIDE_ENV} to a folder holding {', '.join(PYODIDE_FILES)}")
# The lab's policy plus 'wasm-unsafe-eval' (WebAssembly.instantiate) and workers from 'self'.
LESSON_CSP = ("default-src 'self'; script-src 'self' 'wasm-unsafe-eval'; worker-src 'self'; style-src 'self'; "
              "img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; "
              "frame-ancestors 'none'; form-action 'self'")
_MEDIA = {".html": "text/html", ".js": "text/javascript", ".mjs": "text/javascript", ".css": "text/css",
          ".wasm": "application/wasm", ".zip": "application/zip", ".json": "application/json"}
_HERE = Path(__file__).resolve()
# src/attnlab/web/lesson.py -> the repo root; None when imported from an installed wheel (site-packages)
_CHECKOUT_ROOT: Optional[Path] = _HERE.parents[3] if _HERE.parents[2].name == "src" else None


@dataclass(frozen=True)
class PyodideFiles:
    """Where the Pyodide files are (``dir``), or why they are not usable (``problem``, with the fix)."""
    dir: Optional[Path]
    version: Optional[str]
    problem: Optional[str]

    def as_json(self) -> dict:
        return dict(found=self.dir is not None, version=self.version,
                    dir=str(self.dir) if self.dir else None, problem=self.problem)


def _version(folder: Path) -> Optional[str]:
    try:
        return str(json.loads((folder / "package.json").read_text())["version"])
    except (OSError, ValueError, KeyError, TypeError):
        return None              # a bare folder of the five files (no package.json) is accepted as it is


def _check(folder: Path) -> Optional[str]:
    if not folder.is_dir():
        return f"there is no {folder}"
    missing = [f for f in PYODIDE_FILES if not (folder / f).is_file()]
    if missing:
        return f"{folder} lacks {', '.join(missing)}"
    version = _version(folder)
    if version is not None and version != PYODIDE_VERSION:
        return f"{folder} holds pyodide {version}, the lesson is pinned to {PYODIDE_VERSION}"
    return None


def find_pyodide(env: Optional[dict] = None, cwd: Optional[Path] = None) -> PyodideFiles:
    """The Pyodide folder the lesson serves: $ATTNLAB_PYODIDE_DIR, else the checkout's, else the cwd's node_modules.

    Example::

        find_pyodide().dir        # e.g. PosixPath('/work/attnlab/node_modules/pyodide'), or None
    """
    env = os.environ if env is None else env
    if env.get(PYODIDE_ENV):                        # explicit: used alone, and a bad one is reported as such
        folder = Path(env[PYODIDE_ENV]).expanduser()
        why = _check(folder)
        if why:
            return PyodideFiles(None, None, f"{PYODIDE_ENV}={folder} is not usable: {why}; {INSTALL_HINT}")
        return PyodideFiles(folder.resolve(), _version(folder), None)
    tried = []
    roots = [_CHECKOUT_ROOT] if _CHECKOUT_ROOT is not None else []
    for folder in [root / "node_modules" / "pyodide" for root in roots + [cwd or Path.cwd()]]:
        why = _check(folder)
        if why is None:
            return PyodideFiles(folder.resolve(), _version(folder), None)
        tried.append(why)
    return PyodideFiles(None, None, f"the lesson's Python (Pyodide {PYODIDE_VERSION}) is not installed "
                                    f"({'; '.join(dict.fromkeys(tried))}): {INSTALL_HINT}")


def _file(path: Path, **headers) -> FileResponse:
    response = FileResponse(path, media_type=_MEDIA.get(path.suffix, "application/octet-stream"))
    response.headers["Content-Security-Policy"] = LESSON_CSP
    response.headers.update(headers)
    return response


def _not_found(message: str) -> JSONResponse:
    return JSONResponse({"detail": message}, status_code=404, headers={"Content-Security-Policy": LESSON_CSP})


def lesson_router(pyodide: Optional[PyodideFiles] = None) -> APIRouter:
    """The /lesson routes. ``pyodide`` defaults to ``find_pyodide()``, looked up once (and logged if missing).

    Example::

        app.include_router(lesson_router(find_pyodide(env={"ATTNLAB_PYODIDE_DIR": "/opt/pyodide"})))
    """
    files = find_pyodide() if pyodide is None else pyodide
    if files.problem:
        log.warning("lesson page: %s", files.problem)
    # Only names listed here are served: a request path never becomes a file path.
    static = {p.name: p for p in LESSON_DIR.iterdir() if p.is_file() and p.suffix in (".js", ".css")}
    router = APIRouter(prefix="/lesson")

    @router.get("", include_in_schema=False)
    async def page():
        return _file(LESSON_DIR / "lesson.html", **{"Cache-Control": "no-cache"})

    @router.get("/static/{name}", include_in_schema=False)
    async def static_file(name: str):
        if name not in static:
            return _not_found(f"no lesson file {name!r}")
        return _file(static[name], **{"Cache-Control": "no-cache"})

    @router.get("/pyodide/{name}", include_in_schema=False)
    async def pyodide_file(name: str):
        if name not in PYODIDE_FILES:
            return _not_found(f"{name!r} is not one of the Pyodide files {list(PYODIDE_FILES)}")
        if files.dir is None:
            return _not_found(files.problem)
        return _file(files.dir / name, **{"Cache-Control": "max-age=86400"})    # pinned: safe to cache a day

    @router.get("/api/pyodide")
    async def pyodide_status():
        return files.as_json()

    @router.get("/api/readalong")
    async def readalong_list():
        return dict(programs=describe_programs())

    @router.post("/api/readalong/{name}")
    async def readalong_run(name: str):
        if name not in PROGRAMS:
            return _not_found(f"no read-along program {name!r}; the programs are {sorted(PROGRAMS)}")
        return await run_in_threadpool(run_program, name)

    return router
