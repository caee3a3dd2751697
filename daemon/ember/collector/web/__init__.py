"""The collector's web UI: static files served from the package, no CDN
(plain JavaScript against the collector's own JSON/SVG API). Its one
third-party library, uPlot (the charts), is not in the tree: set-up builds it
from deploy/web/package-lock.json into vendor/ (deploy/web/build.sh, ``make
web``), and it is served from there as /vendor/NAME, never fetched at run
time.

The files hold no secret, so the collector serves them without a token; with
a token configured, the page asks the person for it and sends it only in the
Authorization header of its API requests (app.js)."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8"}
#: What deploy/web/build.sh copies (and the wheel ships).
VENDOR = HERE / "vendor"
#: The vendored files the page may load, by name: nothing else under vendor/
#: (its LICENSE, VERSION) and no other path is served.
VENDOR_TYPES = {"uPlot.iife.min.js": "application/javascript; charset=utf-8",
                "uPlot.min.css": "text/css; charset=utf-8"}
#: The answer (after the file's name) for a known vendored file that set-up
#: has not built: the page loads, without its charts.
NOT_BUILT = (" is missing: the web UI's chart library is not built here;"
             " run `make web` (deploy/web/build.sh)\n")
NOT_FOUND = (404, b'{"error": "not found"}', "application/json")


def asset(path: str) -> tuple[int, bytes, str]:
    """(status, body, content type) of a GET of /, /ui/NAME or /vendor/NAME."""
    if path.startswith("/vendor/"):
        return _vendored(path.removeprefix("/vendor/"))
    name = "index.html" if path == "/" else path.removeprefix("/ui/")
    target = (HERE / name).resolve()
    if target.parent != HERE or target.suffix not in TYPES or not target.is_file():
        return NOT_FOUND
    return 200, target.read_bytes(), TYPES[target.suffix]


def _vendored(name: str) -> tuple[int, bytes, str]:
    ctype = VENDOR_TYPES.get(name)
    if ctype is None:
        return NOT_FOUND
    try:
        return 200, (VENDOR / name).read_bytes(), ctype
    except FileNotFoundError:
        return 404, f"/vendor/{name}{NOT_BUILT}".encode(), "text/plain; charset=utf-8"
