"""Prometheus text pages trimmed to the metric families a reader needs.

An engine's `/metrics` page is mostly histogram buckets of metrics nobody here reads, so every
reader (`pools.metrics_scrape`, `autoscale.metrics_sources`) drops the other lines before the
Prometheus parser sees them; this is the one filter they share (`pools` is the lowest layer
both may import).
"""

from __future__ import annotations

from collections.abc import Collection

# the sample names a family's series may carry (`x_total` of counter `x`, `x_bucket`, ...)
SUFFIXES = ("", "_total", "_bucket", "_sum", "_count", "_created", "_info")


def relevant_lines(text: str, families: Collection[str]) -> str:
    """Only the sample and `# TYPE`/`# HELP` lines of `families` (names without the suffixes),
    newline-terminated, ready for `prometheus_client.parser.text_string_to_metric_families`."""
    wanted = {f + s for f in families for s in SUFFIXES}
    keep: list[str] = []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("TYPE", "HELP") and parts[2] in wanted:
                keep.append(line)
            continue
        end = len(line)
        for stop in ("{", " "):
            i = line.find(stop)
            if 0 <= i < end:
                end = i
        if line[:end] in wanted:
            keep.append(line)
    keep.append("")
    return "\n".join(keep)


__all__ = ["SUFFIXES", "relevant_lines"]
