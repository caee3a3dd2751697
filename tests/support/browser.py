"""What the browser tests share: Debian's chromium, its flags, how long a
graph may take to draw, and the colours of a screenshot."""

from __future__ import annotations

import io
from typing import Any

CHROMIUM = "/usr/bin/chromium"
# How long a graph may take to draw: a shared machine under load renders
# slowly, and a wait is not what these tests measure.
DRAWN_MS = 90_000
BROWSER_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-quic"]


def colours(png: bytes) -> tuple[int, int, int]:
    """(distinct colours, warm pixels, blue pixels) of a screenshot."""
    from PIL import Image

    raw = Image.open(io.BytesIO(png)).convert("RGB").tobytes()
    pixels = [tuple(raw[i:i + 3]) for i in range(0, len(raw), 3)]
    warm = sum(1 for r, g, b in pixels if r > 190 and b < 120 and r - b > 100)
    blue = sum(1 for r, g, b in pixels if b > 190 and b - r > 60)
    return len(set(pixels)), warm, blue


# The graphs are canvases: the page lists what it drew (window.ember.frames:
# name n, depth d, value v, x, y, w, h within the canvas, match).
def frames(page: Any, canvas: str = "graph") -> list[dict[str, Any]]:
    return list(page.evaluate("c => window.ember.frames(c)", canvas))


def wait_frame(page: Any, name: str = "", depth: int | None = None, canvas: str = "graph",
               timeout: float = DRAWN_MS) -> None:
    """Wait until ``canvas`` shows a frame (named ``name``, at ``depth``)."""
    page.wait_for_function(
        "([c, n, d]) => window.ember.frames(c).some(f => (n === '' || f.n === n)"
        " && (d === null || f.d === d))", arg=[canvas, name, depth], timeout=timeout)


def named(page: Any, name: str, canvas: str = "graph") -> list[dict[str, Any]]:
    return [f for f in frames(page, canvas) if f["n"] == name]


def click_frame(page: Any, frame: dict[str, Any], canvas: str = "graph") -> None:
    """Click the middle of a drawn frame, as a person would (scrolled to it:
    a deep graph is taller than the window)."""
    page.evaluate("([c, y]) => window.scrollBy(0, document.getElementById(c)"
                  ".getBoundingClientRect().top + y - innerHeight / 2)", [canvas, frame["y"]])
    box = page.locator(f"#{canvas}").bounding_box()
    page.mouse.click(box["x"] + frame["x"] + frame["w"] / 2,
                     box["y"] + frame["y"] + frame["h"] / 2)
