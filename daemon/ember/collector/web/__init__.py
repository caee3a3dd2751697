"""The collector's web UI: static files served from the package, no CDN, no
build step (plain JavaScript against the collector's own JSON/SVG API).

The files hold no secret, so the collector serves them without a token; with
a token configured, the page asks the person for it and sends it only in the
Authorization header of its API requests (app.js)."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8"}


def asset(path: str) -> tuple[int, bytes, str]:
    name = "index.html" if path == "/" else path.removeprefix("/ui/")
    target = (HERE / name).resolve()
    if target.parent != HERE or target.suffix not in TYPES or not target.is_file():
        return 404, b'{"error": "not found"}', "application/json"
    return 200, target.read_bytes(), TYPES[target.suffix]
