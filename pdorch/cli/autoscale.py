"""`pdorch autoscale`: the control loop as its own process, driving a coordinator's pools.

Every tick (`--interval-s`, default the policy's `intervals.reactive_s`) it reads one
`Observation` (`pdorch/autoscaler/source.py`): load, ISL/OSL, hit rate and TTFT/ITL from
`--metrics` (the coordinator's `/metrics` and the engines', or a Prometheus), the pool counts
from the coordinator's `/admin/autoscale` (its actuator); then it asks the planner
(`--planner`, default `pdorch`) and sends the decision to the coordinator's admin API
(`POST /admin/pools/{pool}/scale`, `source: autoscaler`): pools pinned by `pdorch scale
set` are left alone and the decision is recorded with reason `pinned`.
`--dry-run` prints what it would do and changes nothing.

`--actuator kubernetes --config FLEET.yaml` scales the engine Deployments named in the fleet
file's `discovery:` section itself (`pdorch/autoscaler/kubernetes.py`): pool counts from the
API server, drains through every `--drain-url` coordinator, then the `scale` subresource.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from pdorch.cli.scale import DEMO_URL


def autoscale(
    policy: Path = typer.Option(
        ..., "--policy", help="SLO policy YAML (deploy/examples/slo-policy.yaml).", exists=True
    ),
    url: str = typer.Option(
        DEMO_URL, "--url", help="The coordinator's base URL (default: the `pdorch serve` demo)."
    ),
    admin_token: str | None = typer.Option(
        None,
        "--admin-token",
        envvar="PDORCH_ADMIN_TOKEN",
        help="Admin bearer token (default: $PDORCH_ADMIN_TOKEN, else none sent).",
    ),
    model: str | None = typer.Option(
        None,
        "--served-model-name",
        help="A several-model coordinator (`models:` in its fleet file): the served model name "
        "to scale, its metrics and pools read and changed with `?model=` (default: the first "
        "model). Run one `pdorch autoscale` per model.",
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print each decision, change nothing."),
    once: bool = typer.Option(
        False,
        "--once",
        help="Plan once and exit. With `--metrics coordinator` that reads twice, --interval-s "
        "apart (the first read only starts the window).",
    ),
    planner: str = typer.Option("pdorch", "--planner", help="Planner name (autoscale.planners)."),
    interval_s: float | None = typer.Option(
        None,
        "--interval-s",
        min=0.1,
        help="Seconds between ticks (default: the policy's intervals.reactive_s).",
    ),
    metrics: str = typer.Option(
        "coordinator",
        "--metrics",
        help="Where the planner's load and latencies come from: `coordinator` (its /metrics "
        "histograms and /admin/pools, each engine's /metrics scraped) or `prometheus` (PromQL "
        "over --prometheus-url). Pool counts always come from the coordinator's actuator.",
    ),
    prometheus_url: str | None = typer.Option(
        None,
        "--prometheus-url",
        help="Prometheus base URL that scrapes the fleet (deploy/prometheus/); needed with "
        "`--metrics prometheus` (without it that is an error), ignored otherwise.",
    ),
    prometheus_window_s: float = typer.Option(
        60.0,
        "--prometheus-window-s",
        min=1.0,
        help="PromQL lookback in seconds (rate(...[W])) with `--metrics prometheus`.",
    ),
    actuator: str = typer.Option(
        "coordinator",
        "--actuator",
        help="Who carries out decisions: `coordinator` (its admin API and its own actuator: "
        "local engines) or `kubernetes` (this process patches the engine Deployments of "
        "--config's `discovery:` section; needs the `kubernetes` extra).",
    ),
    config: Path | None = typer.Option(
        None,
        "--config",
        exists=True,
        help="Fleet YAML whose `discovery:` section names the namespace, label selectors and "
        "Deployments; needed with `--actuator kubernetes` (an error without it), else ignored.",
    ),
    drain_urls: list[str] | None = typer.Option(
        None,
        "--drain-url",
        metavar="URL,...",
        help="With `--actuator kubernetes`: every coordinator that routes to the engines "
        "(each drains a pod before it goes), comma-separated or repeated. Default: --url.",
    ),
    log_level: str = typer.Option("warning", help="Log level (stderr): debug, info, warning."),
) -> None:
    """Run the autoscaler against a running coordinator until Ctrl-C (or one tick, `--once`).

    Example: `pdorch autoscale --policy deploy/examples/slo-policy.yaml --once --dry-run`
    """
    import asyncio
    import logging
    import signal

    import autoscale.planners  # noqa: F401  (registers every planner)
    from autoscale.metrics_sources.base import MetricsSourceError
    from autoscale.perf_model import build_perf_model
    from autoscale.planner_base import planner_factory, planner_names
    from autoscale.policy import PolicyError, load_policy
    from pdorch.autoscaler.loop import AdminApiDriver, ControlLoop, Driver, DryRunDriver
    from pdorch.autoscaler.source import METRICS_KINDS, AdminCounts, PoolCounts, loop_source
    from pdorch.cli.options import split_list

    logging.basicConfig(level=log_level.upper(), stream=sys.stderr)
    try:
        slo = load_policy(policy)
    except PolicyError as exc:
        sys.stderr.write(f"invalid policy: {exc}\n")
        raise typer.Exit(2) from None
    if planner not in planner_names():
        sys.stderr.write(f"unknown planner {planner!r}; known: {', '.join(planner_names())}\n")
        raise typer.Exit(2)
    if metrics not in METRICS_KINDS:
        sys.stderr.write(f"unknown --metrics {metrics!r}; known: {', '.join(METRICS_KINDS)}\n")
        raise typer.Exit(2)
    if metrics == "prometheus" and not prometheus_url:
        sys.stderr.write("--metrics prometheus needs --prometheus-url\n")
        raise typer.Exit(2)
    if actuator not in ("coordinator", "kubernetes"):
        sys.stderr.write(f"unknown --actuator {actuator!r}; known: coordinator, kubernetes\n")
        raise typer.Exit(2)
    discovery = None
    if actuator == "kubernetes":
        from pdorch.config.fleet import FleetConfigError, load_fleet_config

        if config is None:
            sys.stderr.write("--actuator kubernetes needs --config FLEET.yaml\n")
            raise typer.Exit(2)
        try:
            discovery = load_fleet_config(config).discovery
        except FleetConfigError as exc:
            sys.stderr.write(f"invalid fleet config: {exc}\n")
            raise typer.Exit(2) from None
        if discovery is None or not any(p.deployment for p in discovery.pools.values()):
            sys.stderr.write(
                f"{config}: --actuator kubernetes needs a discovery: section whose pools name "
                "their `deployment`\n"
            )
            raise typer.Exit(2)
    drains = split_list(drain_urls, "--drain-url") if drain_urls else [url]
    interval = interval_s or slo.intervals.reactive_s
    plan = planner_factory(planner)(slo, build_perf_model(slo))

    async def main() -> int:
        import httpx

        kube = drainer = None
        counts: PoolCounts = AdminCounts(url, admin_token, model=model)
        if discovery is not None:
            from autoscale.actuators.kubernetes import CoordinatorDrainer, KubernetesActuator
            from pdorch.autoscaler.kubernetes import KubernetesCounts

            drainer = CoordinatorDrainer(drains, admin_token)
            kube = KubernetesActuator(discovery, drainer, policy=slo)
            counts = KubernetesCounts(kube)
        source = loop_source(
            metrics,
            counts,
            url=url,
            admin_token=admin_token,
            prometheus_url=prometheus_url,
            prometheus_window_s=prometheus_window_s,
            model=model,
        )
        api = None if dry_run or kube is not None else AdminApiDriver(url, admin_token, model)
        driver: Driver = api if api is not None else DryRunDriver(sys.stdout)
        if kube is not None and not dry_run:
            from pdorch.autoscaler.kubernetes import KubernetesDriver

            driver = KubernetesDriver(kube, wait=once)
        loop = ControlLoop(plan, source, driver, interval)
        try:
            if once:
                try:
                    decision = await loop.first_decision()
                except (httpx.HTTPError, MetricsSourceError) as exc:
                    sys.stderr.write(f"error: metrics or coordinator at {url}: {exc}\n")
                    return 2
                for pool, n in decision.desired.items():
                    sys.stderr.write(f"{pool}: {n} ({decision.reasons.get(pool, '')})\n")
                return 0
            stop = asyncio.Event()
            running = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                running.add_signal_handler(sig, stop.set)
            await loop.run(stop)
            return 0
        finally:
            await source.aclose()
            if api is not None:
                await api.aclose()
            if kube is not None:
                await kube.aclose()
            if drainer is not None:
                await drainer.aclose()

    code = asyncio.run(main())
    if code:
        raise typer.Exit(code)
