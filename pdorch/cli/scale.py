"""`pdorch scale status|set|auto|move`: watch and drive a running coordinator's pools.

Every command talks to the coordinator's admin API (`pdorch/app/admin_scale.py`) at `--url`
(default: the demo's http://127.0.0.1:8000, so `pdorch serve` + `pdorch scale ...` works with no
arguments); `--admin-token` (or `PDORCH_ADMIN_TOKEN`) when the fleet sets one. Errors the
coordinator answers (unknown pool, a count below min / above max / over the GPU budget) are
printed as they come, naming the problem, and exit with status 1; an unreachable coordinator
exits with 2. `--served-model-name NAME`: a several-model fleet's model (default: its
first), sent as the admin API's `?model=`; an unknown name exits 1 with the coordinator's 404
naming the served ones.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import typer

DEMO_URL = "http://127.0.0.1:8000"

URL_OPTION = typer.Option(
    DEMO_URL, "--url", help="The coordinator's base URL (default: the `pdorch serve` demo)."
)
TOKEN_OPTION = typer.Option(
    None,
    "--admin-token",
    envvar="PDORCH_ADMIN_TOKEN",
    help="Admin bearer token, when the fleet file sets coordinator.admin_token (default: "
    "$PDORCH_ADMIN_TOKEN, else none sent).",
)
MODEL_OPTION = typer.Option(
    None,
    "--served-model-name",
    help="A several-model fleet (`models:` in the fleet file): the served model name (what "
    "clients put in `model`) whose pools to read or change (default: the file's first model).",
)
JSON_OPTION = typer.Option(
    False, "--json", help="Print one JSON object on stdout instead of the table/message."
)


def _call(
    method: str,
    url: str,
    path: str,
    token: str | None,
    body: dict[str, Any] | None = None,
    model: str | None = None,
) -> dict[str, Any]:
    import httpx

    headers = {"authorization": f"Bearer {token}"} if token else {}
    params = {"model": model} if model else None  # the admin API's `?model=` (models.py)
    try:
        response = httpx.request(
            method,
            url.rstrip("/") + path,
            json=body,
            headers=headers,
            params=params,
            timeout=30.0,
        )
    except httpx.HTTPError as exc:
        sys.stderr.write(f"error: cannot reach the coordinator at {url}: {exc}\n")
        raise typer.Exit(2) from None
    try:
        data = response.json()
    except ValueError:
        data = {"error": {"message": response.text}}
    if response.status_code >= 400:
        message = (data.get("error") or {}).get("message") if isinstance(data, dict) else None
        sys.stderr.write(f"error ({response.status_code}): {message or response.text}\n")
        raise typer.Exit(1)
    assert isinstance(data, dict)
    return data


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def status(
    url: str = URL_OPTION,
    admin_token: str | None = TOKEN_OPTION,
    model: str | None = MODEL_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Per pool: replicas ready/pending/draining, role, load, KV usage, observed p90 latency
    against the SLO, the last autoscaler decision and why.

    Observed p90: TTFT for the prefill pool, ITL (each stream's mean gap) for the decode pool,
    both for other pools, shown as `p90 / SLO target` (`TTFT 0.41s / 2.00s`, `ITL 12.5ms /
    50.0ms`; the target only when the coordinator runs with an SLO policy). Taken from the
    autoscaler's last decision while it is at most 60 s old (fleet-wide, over its window),
    else from the coordinator's own requests over the last 60 s (a rolling window of 10 s
    slots: 50-60 s of requests; `-` when it holds none).

    `draining` shows `N (K recalled)` once a scale-up took K draining replicas of the pool
    back into routing instead of a cold start.

    `--json`: `{"pools": {"<pool>": {"ready", "pending", "draining", "recalled", "pinned",
    "role", "load", "kv_usage", "observed", "last_decision", "replicas": [...]}},
    "decisions": [...]}`;
    `observed`: `{"source": "coordinator"|"autoscaler", "window_s", "age_s", "ttft_p90_s",
    "ttft_samples", "ttft_slo_s", "ttft_slo_percentile", "itl_p90_s", "itl_samples",
    "itl_slo_s", "itl_slo_percentile"}` (seconds; null where not known or not the pool's
    metric).

    Example: `pdorch scale status --url http://127.0.0.1:8000`
    """
    from rich.console import Console
    from rich.table import Table

    view = _call("GET", url, "/admin/autoscale", admin_token, model=model)
    if as_json:
        sys.stdout.write(json.dumps(view) + "\n")
        return
    at = f"{url} model {model}" if model else url
    table = Table(title=f"pools at {at} (autoscaler: {view.get('autoscaler') or 'none'})")
    for column in (
        "pool", "role", "ready", "pending", "draining", "pinned", "in flight", "KV usage",
        "p90 / SLO", "last decision",
    ):  # fmt: skip
        table.add_column(column)
    sources: set[str] = set()
    for pool, row in view["pools"].items():
        observed = row.get("observed") or {}
        if observed.get("source"):
            sources.add(_source(observed))
        latency = _latency(observed)
        last = row.get("last_decision")
        decided = f"{last['desired']} ({last['reason']})" if last else "-"
        switchable = sum(1 for r in row.get("replicas", []) if r.get("switchable"))
        role = row.get("role", pool) + (f" ({switchable} switchable)" if switchable else "")
        table.add_row(
            pool,
            role,
            str(row["ready"]),
            str(row["pending"]),
            _draining(row),
            _fmt(row.get("pinned")),
            str(row["load"]["requests_in_flight"]),
            _fmt(row.get("kv_usage")),
            latency,
            decided,
        )
    if sources:
        table.caption = "p90 from " + "; ".join(sorted(sources))
    Console().print(table)


def _draining(row: dict[str, Any]) -> str:
    """`1`, or `1 (2 recalled)` once a scale-up took draining replicas back."""
    recalled = row.get("recalled") or 0
    return f"{row['draining']}" + (f" ({recalled} recalled)" if recalled else "")


def seconds_text(value: float) -> str:
    """A latency for the table: `0.41s` from 0.1 s up, `12.5ms` below (ITLs are ms)."""
    return f"{value:.2f}s" if value >= 0.1 else f"{value * 1000:.1f}ms"


def _latency(observed: dict[str, Any]) -> str:
    """`TTFT 0.41s / 2.00s` (p90 / SLO target) for each metric the pool's row shows."""
    parts = []
    for name, key in (("TTFT", "ttft"), ("ITL", "itl")):
        p90, slo = observed.get(f"{key}_p90_s"), observed.get(f"{key}_slo_s")
        if p90 is None and slo is None and observed.get(f"{key}_samples") is None:
            continue  # not this pool's metric (or nothing known of it)
        text = f"{name} {seconds_text(p90) if p90 is not None else '-'}"
        parts.append(text + (f" / {seconds_text(slo)}" if slo is not None else ""))
    return ", ".join(parts) or "-"


def _source(observed: dict[str, Any]) -> str:
    window = observed.get("window_s")
    span = f", {window:g} s window" if isinstance(window, int | float) else ""
    if observed["source"] == "autoscaler":
        return f"the autoscaler's last decision{span}"
    return f"the coordinator's own requests{span}"


_COUNT = re.compile(r"^[+-]?\d+$")


def set_count(
    pool: str = typer.Argument(..., help="Pool to scale: prefill or decode."),
    count: str = typer.Argument(
        ..., metavar="N|+N|-N", help="Replicas wanted (N), or a change (+N / -N)."
    ),
    url: str = URL_OPTION,
    admin_token: str | None = TOKEN_OPTION,
    model: str | None = MODEL_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Scale a pool by hand. The count pins the pool: the autoscaler leaves it alone until
    `pdorch scale auto POOL`. Scaling down drains (no request is lost).

    Example: `pdorch scale set decode +1`
    """
    if not _COUNT.match(count):
        sys.stderr.write(f"error: count {count!r} is not N, +N or -N\n")
        raise typer.Exit(2)
    body: dict[str, Any] = {"delta": int(count)} if count[0] in "+-" else {"replicas": int(count)}
    done = _call("POST", url, f"/admin/pools/{pool}/scale", admin_token, body, model)
    if as_json:
        sys.stdout.write(json.dumps(done) + "\n")
        return
    sys.stderr.write(f"pool {done['pool']}: {done['replicas']} replicas (pinned)\n")


def auto(
    pool: str = typer.Argument(..., help="Pool to hand back to the autoscaler."),
    url: str = URL_OPTION,
    admin_token: str | None = TOKEN_OPTION,
    model: str | None = MODEL_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Unpin a pool: the autoscaler sizes it again.

    Example: `pdorch scale auto decode`
    """
    done = _call("POST", url, f"/admin/pools/{pool}/auto", admin_token, model=model)
    if as_json:
        sys.stdout.write(json.dumps(done) + "\n")
        return
    sys.stderr.write(f"pool {done['pool']}: back to the autoscaler\n")


def move(
    replica: str = typer.Argument(..., help="Replica id (see `pdorch scale status --json`)."),
    to: str = typer.Option(..., "--to", help="Pool to move it to: prefill or decode."),
    url: str = URL_OPTION,
    admin_token: str | None = TOKEN_OPTION,
    model: str | None = MODEL_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Switch a role-agnostic replica (sim role both, vLLM kv_both; launch spec
    `switchable: true`) to the other pool: it drains its current-role work, then is
    re-labelled, without a restart.

    Example: `pdorch scale move decode-1 --to prefill`
    """
    done = _call("POST", url, f"/admin/replicas/{replica}/move", admin_token, {"to": to}, model)
    if as_json:
        sys.stdout.write(json.dumps(done) + "\n")
        return
    sys.stderr.write(f"replica {replica}: {done['from_pool']} → {done['to_pool']} (draining)\n")
