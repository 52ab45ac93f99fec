"""The local web lab: ``create_app()`` (FastAPI) serving a static page and a JSON API over
``attnlab.lab.inspect``. Start it with ``attnlab serve`` (bound to 127.0.0.1).

Example::

    import uvicorn
    from attnlab.web import create_app
    uvicorn.run(create_app(), host="127.0.0.1", port=8000)
"""
from .app import DEFAULT_MAX_CHARS, create_app

__all__ = ["create_app", "DEFAULT_MAX_CHARS"]
