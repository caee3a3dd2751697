#!/usr/bin/env python3
"""Rendering a large profile: 100k distinct stacks (depth 8-40, a skewed
weight distribution, realistic name lengths) -> SVG; reports time, output
size and the number of frames drawn, and the same for the HTML form.

    .venv/bin/python bench/flamegraph_large.py [--stacks 100000]
"""

from __future__ import annotations

import argparse
import random
import time
from collections import Counter

from ember.flamegraph.svg import Options, build_tree, render, to_html


def make_stacks(n: int, rng: random.Random) -> Counter[str]:
    names = [f"ns{i % 97}::Component{i}::method_{i * 7 % 1000}(int, std::string const&)"
             for i in range(5000)]
    out: Counter[str] = Counter()
    while len(out) < n:
        depth = rng.randint(8, 40)
        # shared prefixes, like real programs: pick from a small set near the root
        stack = [f"thread{rng.randint(0, 7)}"] + [
            names[min(len(names) - 1, int(rng.paretovariate(1.2) * (level + 1)) % len(names))]
            for level in range(depth)]
        out[";".join(stack)] += int(rng.paretovariate(1.1)) + 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stacks", type=int, default=100_000)
    args = ap.parse_args()
    stacks = make_stacks(args.stacks, random.Random(1))
    t0 = time.perf_counter()
    tree = build_tree(stacks)
    t1 = time.perf_counter()
    svg = render(tree, Options(title="large"))
    t2 = time.perf_counter()
    page = to_html(svg, "large")
    drawn = svg.count('<g class="f"')
    print(f"{len(stacks)} distinct stacks, total weight {sum(stacks.values())}")
    print(f"tree {t1 - t0:.2f} s, render {t2 - t1:.2f} s, total {t2 - t0:.2f} s")
    print(f"SVG {len(svg) / 1e6:.2f} MB, HTML {len(page) / 1e6:.2f} MB, {drawn} frames drawn "
          "(narrow siblings merged)")


if __name__ == "__main__":
    main()
