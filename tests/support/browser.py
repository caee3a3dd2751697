"""What the browser tests share: Debian's chromium, its flags, how long a
graph may take to draw, and the colours of a screenshot."""

from __future__ import annotations

import io

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
