"""What `pdorch serve` prints once it serves: the pools and replicas it started, where to reach
them, and three commands to try (curl, the `openai` SDK, `pdorch scale status`).

Printed with rich to the console `serve` writes to (stderr under `--json`); the commands are
plain text a user can paste, so they are printed without markup or wrapping (`soft_wrap`).
Under `--json` the same facts are one JSON line on stdout (`started_line`).
"""

from __future__ import annotations

import json
import shlex
from collections import Counter
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

DEMO_PROMPT = "Tell me a story about the sea."


def try_commands(url: str, model: str, *, admin_token: bool) -> list[tuple[str, str]]:
    """(what, command) for the three commands to try against a coordinator at `url`."""
    body = json.dumps({"model": model, "prompt": DEMO_PROMPT, "max_tokens": 24})
    curl = (
        f"curl -s {url}/v1/completions -H 'Content-Type: application/json' -d {shlex.quote(body)}"
    )
    # double quotes inside, so the shell line is one plain single-quoted argument
    sdk = (
        "from openai import OpenAI; "
        f'c = OpenAI(base_url={json.dumps(url + "/v1")}, api_key="none"); '
        f"r = c.chat.completions.create(model={json.dumps(model)}, max_tokens=24, "
        'messages=[{"role": "user", "content": "Hello!"}]); '
        "print(r.choices[0].message.content)"
    )
    scale = f"pdorch scale status --url {url}"
    if admin_token:
        scale += ' --admin-token "$PDORCH_ADMIN_TOKEN"'
    return [
        ("a completion (curl)", curl),
        ("a chat answer (the openai SDK)", f"python -c {shlex.quote(sdk)}"),
        ("the pools and the autoscaler", scale),
    ]


def started_line(
    url: str, served_model_name: str, models: Sequence[str], endpoints: Sequence[Any]
) -> dict[str, Any]:
    """`pdorch serve --json`'s start-up line: where to reach it, its models, every replica
    (`endpoints` as in `print_started`); callers add their own keys (`workers`)."""
    return {
        "url": url,
        "served_model_name": served_model_name,
        "models": list(models),
        "replicas": [
            {
                "replica": e.replica_id,
                "model": e.model,
                "pool": e.pool,
                "kind": e.kind,
                "url": e.url,
                "kv_events_endpoint": e.kv_events_endpoint,
            }
            for e in endpoints
        ],
    }


def print_started(
    console: Console,
    *,
    what: str,
    url: str,
    models: Sequence[str],
    endpoints: Sequence[Any],
    admin_token: bool,
) -> None:
    """The start-up printout (see the module docstring); `endpoints` are the running replicas
    (`replica_id`, `model`, `pool`, `kind`, `url`, `kv_events_endpoint`)."""
    pools = Counter((str(e.model), str(e.pool)) for e in endpoints)
    summary = ", ".join(f"{n} {pool}" for (_, pool), n in pools.items())
    table = Table(title=f"pdorch: {what} ({summary})", title_justify="left")
    for column in ("replica", "model", "pool", "kind", "url", "KV events"):
        table.add_column(column)
    for e in endpoints:
        table.add_row(
            e.replica_id, e.model, e.pool, e.kind, e.url, e.kv_events_endpoint or "(approximate)"
        )
    console.print(table)
    console.print(
        f"[bold green]serving[/bold green] {', '.join(map(repr, models))} "
        f"(OpenAI API) at [bold]{url}/v1[/bold]"
    )
    console.print(f"  admin: {url}/admin/pools  metrics: {url}/metrics")
    console.print(f"  status page: {url}/dashboard")
    console.print("[bold]try[/bold]:")
    for n, (label, command) in enumerate(try_commands(url, models[0], admin_token=admin_token)):
        console.print(f"  {n + 1}. {label}:")
        console.print(f"     {command}", markup=False, highlight=False, soft_wrap=True)
