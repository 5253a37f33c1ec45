"""The browser page at ``/`` (issue 18): its HTML and static files, served with a strict CSP.

Rules:
- ``GET /`` is the page and ``GET /static/<path>`` its files; neither needs a token
  (they hold no data: the page asks the API with the token the user pastes). The
  Guard's Host check (``app.py``) applies to them as to every route.
- Every answer here, a 404 included, carries ``SECURITY_HEADERS``: a CSP at least as
  strict as F-SRV-3's (no inline script or style, nothing from another origin, no
  framing, no forms), ``nosniff`` and ``no-referrer``. Nothing here relaxes the CSP for
  xterm.js: ``static/csp-shim.js`` turns its ``<style>`` elements and ``style``
  attributes into CSSOM calls, which the CSP allows (docs/server.md, "The page").
- A static path is served only if every segment is a plain name (no ``..``, no dot
  file, no backslash or NUL, after percent-decoding), it resolves inside ``static/``
  with no symlink leading out, it is a regular file, and its extension is in
  ``CONTENT_TYPES``; anything else is 404. The content type comes from that table,
  never from a guess.
- ``static/vendor/`` (xterm.js, copied from ``web/`` by ``scripts/setup``) may be
  missing: its files are then 404 and the page says so in plain words.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

STATIC_DIR = Path(__file__).resolve().parent / "static"

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; "
    "form-action 'none'"
)

SECURITY_HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    # the page changes with the package; an old copy would talk to a new API
    "cache-control": "no-cache",
}

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".png": "image/png",
    ".svg": "image/svg+xml",
}


def static_file(rel: str, root: Path = STATIC_DIR) -> Path | None:
    """The file under ``root`` that ``rel`` (already percent-decoded) names, or None.

    None for anything the module rules do not allow; the caller answers 404.
    """
    parts = rel.split("/")
    for part in parts:
        if not part or part.startswith(".") or "\\" in part or "\0" in part:
            return None
    if os.path.splitext(parts[-1])[1] not in CONTENT_TYPES:
        return None
    base = root.resolve()
    try:
        full = (base / rel).resolve(strict=True)
    except (OSError, RuntimeError):
        return None  # missing, or a symlink loop: not found either way
    if not full.is_relative_to(base) or not full.is_file():
        return None
    return full


def mount_page(app: Any) -> None:
    """Add ``GET /`` and ``GET /static/{path}`` to the FastAPI ``app``."""
    from fastapi import FastAPI
    from fastapi.responses import Response

    api: FastAPI = app  # typed, so the route decorators keep their signatures

    def answer(path: Path | None) -> Response:
        if path is None:
            return Response(
                b'{"error": {"code": "not_found", "message": "no such file"}}',
                status_code=404,
                media_type="application/json",
                headers=SECURITY_HEADERS,
            )
        try:
            body = path.read_bytes()
        except OSError:
            return answer(None)  # vanished between the check and the read
        return Response(body, media_type=CONTENT_TYPES[path.suffix], headers=SECURITY_HEADERS)

    @api.get("/", include_in_schema=False)
    async def page() -> Response:
        return answer(static_file("index.html"))

    @api.get("/static/{rel:path}", include_in_schema=False)
    async def static(rel: str) -> Response:
        # ``rel`` is percent-decoded by then: ``%2e%2e`` arrives as ``..`` and is refused
        return answer(static_file(rel))
