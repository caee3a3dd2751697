"""A flame graph SVG parsed back: one dict per drawn frame."""

from __future__ import annotations

import xml.etree.ElementTree as ET

NS = {"s": "http://www.w3.org/2000/svg"}


def frames(svg_text: str) -> list[dict[str, object]]:
    root = ET.fromstring(svg_text.encode())
    out: list[dict[str, object]] = []
    for g in root.iterfind(".//s:g[@class='f']", NS):
        rect = g.find("s:rect", NS)
        text = g.find("s:text", NS)
        title = g.find("s:title", NS)
        assert rect is not None and title is not None
        out.append({"name": g.get("data-n"), "v": float(g.get("data-v", 0)),
                    "o": float(g.get("data-o", 0)), "d": int(g.get("data-d", 0)),
                    "x": float(rect.get("x", 0)), "w": float(rect.get("width", 0)),
                    "y": float(rect.get("y", 0)), "fill": rect.get("fill"),
                    "label": (text.text or "") if text is not None else "",
                    "title": title.text or ""})
    return out
