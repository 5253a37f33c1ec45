"""The browser page at ``/`` (issue 18): served with a strict Content-Security-Policy."""

from __future__ import annotations

from typing import Any


def mount_page(app: Any) -> None:
    """Add the page's routes to the FastAPI ``app`` (none yet)."""
