"""Self time per function from a py-spy flame graph (the SVG `pdorch bench proxy
--py-spy-dir` writes), scaled to µs per request: the "top costs per request" tables of
`benchmarks/results/proxy.md`.

    python -m benchmarks.proxy.flame_self FLAME.svg CPU_US_PER_REQ [--top 30] [--inclusive]

A frame's self samples are its samples less its children's (the frames one row further from
the root within its x-range); functions are summed over their lines. py-spy samples the
process while it is not idle, so the shares are of its busy time; they are scaled by the
bench's measured proxy CPU per request (psutil) to read as µs per request. `--inclusive`:
a function's samples with its callees (the union of its frames' x-ranges, so recursion and
nesting count once), e.g. the whole routing decision under `PdRouter.route`.
"""

from __future__ import annotations

import argparse
import html
import re
from collections import Counter, defaultdict
from pathlib import Path

_FRAME = re.compile(
    r'<g><title>(.*?) \((\d[\d,]*) samples?, [\d.]+%\)</title><rect x="[^"]*" y="(\d+)"'
    r'[^>]*fg:x="(\d+)" fg:w="(\d+)"'
)
_ROW = 16  # inferno's frame height + gap, in SVG units


def self_samples(svg: str) -> tuple[Counter[str], int]:
    """(self samples per function, total samples) of one flame graph."""
    frames = [(int(m[3]), int(m[4]), int(m[5]), html.unescape(m[1])) for m in _FRAME.finditer(svg)]
    root = next(f for f in frames if f[3] == "all")
    step = _ROW if root[0] < max(f[0] for f in frames) else -_ROW  # icicle or flame
    rows: defaultdict[int, list[tuple[int, int]]] = defaultdict(list)
    for y, x, w, _ in frames:
        rows[y].append((x, w))
    out: Counter[str] = Counter()
    for y, x, w, name in frames:
        children = sum(cw for cx, cw in rows[y + step] if cx >= x and cx + cw <= x + w)
        out[re.sub(r":\d+\)", ")", name)] += w - children
    return out, root[2]


def inclusive_samples(svg: str) -> tuple[Counter[str], int]:
    """(samples per function with its callees, total samples): the union of the x-ranges of
    the function's frames (a frame nested in another of the same function counts once)."""
    frames = [(int(m[4]), int(m[5]), html.unescape(m[1])) for m in _FRAME.finditer(svg)]
    total = next(w for _, w, name in frames if name == "all")
    spans: defaultdict[str, list[tuple[int, int]]] = defaultdict(list)
    for x, w, name in frames:
        spans[re.sub(r":\d+\)", ")", name)].append((x, x + w))
    out: Counter[str] = Counter()
    for name, ranges in spans.items():
        covered, end = 0, -1
        for lo, hi in sorted(ranges):
            if hi <= end:
                continue
            covered += hi - max(lo, end)
            end = hi
        out[name] = covered
    return out, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("svg", type=Path)
    parser.add_argument("cpu_us_per_req", type=float)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--inclusive", action="store_true", help="with callees (see above)")
    args = parser.parse_args()
    svg = args.svg.read_text()
    counts, total = inclusive_samples(svg) if args.inclusive else self_samples(svg)
    print(f"{total} samples; shares of the busy time x {args.cpu_us_per_req:g} µs/request")
    for name, n in counts.most_common(args.top):
        print(f"{100 * n / total:6.2f}%  {args.cpu_us_per_req * n / total:8.1f} µs  {name}")


if __name__ == "__main__":
    main()
