"""``ember flamegraph`` and ``ember diff``: stacks -> trees -> SVG.

Plain, hot/cold and differential graphs of ``Stacks`` (inputs.py reads
them), with their titles, palettes and display units, and the table of
the hottest functions next to them. The CLI draws from sources; the
collector draws from what it has merged.
"""

from __future__ import annotations

from collections import Counter

from ..errors import UsageError
from . import svg
from .inputs import MAX_INPUT_SIZE, Stacks, as_time, load, strip_hex


def _time_display(total_ns: float) -> tuple[str, float]:
    return ("s", 1e-9) if total_ns >= 10e9 else ("ms", 1e-6)


def options(s: Stacks, title: str | None, countname: str, palette: str, inverted: bool,
            width: int, mode: str = "plain") -> svg.Options:
    unit, scale = _time_display(s.total) if s.unit == "ns" else ("", 1.0)
    if palette == "auto":
        palette = "io" if s.offcpu else "hot"
    default_title = {"plain": "Off-CPU Time Flame Graph" if s.offcpu else "Flame Graph",
                     "diff": "Differential Flame Graph", "hotcold": "Hot/Cold Flame Graph"}[mode]
    return svg.Options(title=title or default_title,
                       countname=countname if s.unit != "ns" else "ns",
                       unit=unit, unit_scale=scale, palette=palette, mode=mode,
                       inverted=inverted, width=width)


def graph(s: Stacks, title: str | None = None, countname: str = "samples",
          palette: str = "auto", inverted: bool = False, width: int = 1200) -> str:
    tree = svg.build_tree(s.stacks, kinds=s.kinds)
    return svg.render(tree, options(s, title, countname, palette, inverted, width))


def hotcold_graph(on: Stacks, off: Stacks, title: str | None = None,
                  countname: str = "samples", palette: str = "auto", inverted: bool = False,
                  width: int = 1200) -> str:
    both = Counter(on.stacks)
    both.update(off.stacks)
    tree = svg.build_tree(both, other=off.stacks, kinds={**off.kinds, **on.kinds})
    return svg.render(tree, options(Stacks(both, "ns", {}), title, countname, palette,
                                    inverted, width, mode="hotcold"))


def flamegraph(source: str, title: str | None = None, countname: str = "samples",
               palette: str = "auto", inverted: bool = False, width: int = 1200,
               cold: str | None = None, frequency: int | None = None, *,
               token: str = "", cafile: str | None = None,
               max_size: int = MAX_INPUT_SIZE) -> str:
    """The SVG of a source (with cold, hot/cold); collector URLs are fetched
    with the bearer token and checked against cafile; max_size bounds each
    input (``inputs.load``)."""
    hot = load(source, countname, token=token, cafile=cafile, max_size=max_size)
    if cold is None:
        return graph(hot, title, countname, palette, inverted, width)
    on = as_time(hot, frequency, source)
    off = as_time(load(cold, "us", token=token, cafile=cafile, max_size=max_size), frequency,
                  cold)
    return hotcold_graph(on, off, title, countname, palette, inverted, width)


def diff(before_src: str, after_src: str, normalize: bool = False, strip: bool = False,
         negate: bool = False, title: str | None = None, countname: str = "samples",
         width: int = 1200, *, token: str = "", cafile: str | None = None,
         max_size: int = MAX_INPUT_SIZE) -> tuple[str, str]:
    """(SVG, two-column folded diff "stack before after"); max_size bounds
    each input (``inputs.load``)."""
    before = load(before_src, countname, token=token, cafile=cafile, max_size=max_size)
    after = load(after_src, countname, token=token, cafile=cafile, max_size=max_size)
    return diff_graph(before, after, normalize, strip, negate, title, countname, width)


def diff_graph(before: Stacks, after: Stacks, normalize: bool = False, strip: bool = False,
               negate: bool = False, title: str | None = None, countname: str = "samples",
               width: int = 1200) -> tuple[str, str]:
    if before.unit != after.unit:
        raise UsageError(f"cannot compare {before.unit} with {after.unit}")
    b, a = before.stacks, after.stacks
    if strip:
        b, a = strip_hex(b), strip_hex(a)
    total_before = float(sum(b.values()))
    if normalize and total_before:
        factor = sum(a.values()) / total_before
        b = Counter({k: round(v * factor) for k, v in b.items()})
    two_column = "".join(f"{k} {b.get(k, 0)} {a.get(k, 0)}\n" for k in sorted(set(a) | set(b)))
    kinds = {**before.kinds, **after.kinds}
    if negate:  # shapes from BEFORE: what vanished shows, in blue
        tree = svg.build_tree(b, other=a, kinds=kinds)
    else:
        tree = svg.build_tree(a, other=b, kinds=kinds)
    shown = Stacks(b if negate else a, after.unit, kinds)
    o = options(shown, title, countname, "hot", False, width, mode="diff")
    if negate:
        o = svg.Options(**{**o.__dict__, "negate": True})
    return svg.render(tree, o), two_column


def top_functions(s: Stacks, limit: int = 100) -> list[dict[str, object]]:
    """Self and total value per function name (total counts a name once per
    stack, however often it recurs)."""
    self_: Counter[str] = Counter()
    total: Counter[str] = Counter()
    for stack, v in s.stacks.items():
        names = [n for n in stack.split(";")[1:] if n != "-"]  # without the thread name
        if not names:
            continue
        self_[names[-1]] += v
        for n in set(names):
            total[n] += v
    rows = sorted(total, key=lambda n: (-self_[n], -total[n], n))[:limit]
    return [{"name": n, "self": self_[n], "total": total[n]} for n in rows]
