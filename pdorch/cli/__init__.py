"""The `pdorch` command line.

Each command lives in its own module under `pdorch/cli/` and imports its heavy dependencies
inside the function body, so `pdorch --help` stays fast and one broken extra (say, NIXL) does
not take the whole CLI down. Only the `bench` commands may import `benchmarks`.
"""

from __future__ import annotations

import typer

from pdorch.cli import autoscale as autoscale_cmd
from pdorch.cli import bench_autoscale as bench_autoscale_cmd
from pdorch.cli import bench_chaos as bench_chaos_cmd
from pdorch.cli import bench_live as bench_live_cmd
from pdorch.cli import bench_proxy as bench_proxy_cmd
from pdorch.cli import bench_router, bench_transfer, dev_tiny_model, engine_sim, engine_vllm
from pdorch.cli import bench_sim as bench_sim_cmd
from pdorch.cli import bench_soak as bench_soak_cmd
from pdorch.cli import plan as plan_cmd
from pdorch.cli import profile as profile_cmd
from pdorch.cli import scale as scale_cmd
from pdorch.cli import serve as serve_cmd
from pdorch.cli.options import renamed

app = typer.Typer(
    name="pdorch",
    help="pdorch: prefill/decode disaggregation orchestrator for LLM serving fleets.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

dev_app = typer.Typer(help="Developer tools (tiny model for CPU tests, ...).", no_args_is_help=True)
engine_app = typer.Typer(
    help="Run one engine in the foreground: a real vLLM engine or a simulated one.",
    no_args_is_help=True,
)
bench_app = typer.Typer(
    help="Benchmarks: each prints a table (or JSON with --json); results go under "
    "benchmarks/results/.",
    no_args_is_help=True,
)

scale_app = typer.Typer(
    help="Watch and drive a running coordinator's pools (ready/pending/draining, manual "
    "counts, role moves).",
    no_args_is_help=True,
)

app.add_typer(dev_app, name="dev")
app.add_typer(engine_app, name="engine")
app.add_typer(bench_app, name="bench")
app.add_typer(scale_app, name="scale")

dev_app.command("tiny-model", cls=dev_tiny_model.PositionalDirIsOut)(dev_tiny_model.tiny_model)
# cls=renamed(...): the old flag spellings of a command keep working, hidden, for one release.
engine_app.command("vllm", cls=renamed(engine_vllm.RENAMED))(engine_vllm.engine_vllm)
engine_app.command("sim", cls=renamed(engine_sim.RENAMED))(engine_sim.engine_sim)
bench_app.command("transfer")(bench_transfer.bench_transfer)
bench_app.command("router", cls=renamed(bench_router.RENAMED))(bench_router.bench_router)
bench_app.command("sim", cls=renamed(bench_sim_cmd.RENAMED))(bench_sim_cmd.bench_sim)
bench_app.command("live", cls=renamed(bench_live_cmd.RENAMED))(bench_live_cmd.bench_live)
bench_app.command("proxy", cls=renamed(bench_proxy_cmd.RENAMED))(bench_proxy_cmd.bench_proxy)
bench_app.command("chaos")(bench_chaos_cmd.bench_chaos)
bench_app.command("soak")(bench_soak_cmd.bench_soak)
bench_app.command("autoscale", cls=renamed(bench_autoscale_cmd.RENAMED))(
    bench_autoscale_cmd.bench_autoscale
)
app.command("profile", cls=renamed(profile_cmd.RENAMED))(profile_cmd.profile)
app.command("serve")(serve_cmd.serve)
app.command("plan")(plan_cmd.plan)
app.command("autoscale")(autoscale_cmd.autoscale)
scale_app.command("status")(scale_cmd.status)
# "-1" is a count, not an unknown option
scale_app.command("set", context_settings={"ignore_unknown_options": True})(scale_cmd.set_count)
scale_app.command("auto")(scale_cmd.auto)
scale_app.command("move")(scale_cmd.move)


def main() -> None:
    app(prog_name="pdorch")  # also under `python -c "from pdorch.cli import main; main()"`
