"""Prometheus file_sd targets for a fleet's engines, from a coordinator's `/admin/pools`.

`file_sd_targets(view)` gives one entry per replica of every pool:
`{"targets": ["host:port"], "labels": {"pool", "replica", "__metrics_path__", "__scheme__"}}`,
the format of Prometheus's `file_sd_configs` (JSON). `deploy/prometheus/prometheus.yml`'s
`pdorch-engines` job reads such a file; a fleet that scales rewrites it (Prometheus re-reads
it every `refresh_interval`). Draining and pending replicas are listed too: they still
serve (or will), and their series should not vanish mid-window.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit


def file_sd_targets(view: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One file_sd entry per replica of `view` (a `GET /admin/pools` answer)."""
    out: list[dict[str, Any]] = []
    for pool, pool_view in sorted(view.get("pools", {}).items()):
        for replica in pool_view.get("replicas", []):
            url = replica.get("metrics_url") or f"{str(replica['url']).rstrip('/')}/metrics"
            parts = urlsplit(url)
            out.append(
                {
                    "targets": [parts.netloc],
                    "labels": {
                        "pool": pool,
                        "replica": str(replica["id"]),
                        "__metrics_path__": parts.path or "/metrics",
                        "__scheme__": parts.scheme or "http",
                    },
                }
            )
    return out


def write_file_sd(view: Mapping[str, Any], path: Path) -> None:
    """Write the targets atomically (Prometheus may read the file at any moment)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(file_sd_targets(view), indent=2) + "\n")
    tmp.replace(path)
