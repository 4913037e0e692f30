"""`pdorch engine vllm`: run one real vLLM engine in the foreground, P/D-ready.

Scripts and pools start engines through this command: it picks free ports when none are
given, prints exactly one line `ready <http-url>` on stdout once `/health` answers (everything
else goes to stderr or the engine log), and stops the engine's whole process group on SIGINT or
SIGTERM, so a supervisor that kills this command never leaves a vLLM behind.
"""

from __future__ import annotations

import signal
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

import typer

from pdorch.cli.options import split_ints

RENAMED = {"--model": "--model-dir", "--start-timeout": "--start-timeout-s"}
"""Old flag spellings, accepted as hidden aliases for one release (pdorch/cli/options.py)."""


class _StopRequested(BaseException):
    """Raised from the signal handler to unwind start-up or serving into the `finally`."""


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise _StopRequested(signal.Signals(signum).name)


def engine_vllm(
    model_dir: Path = typer.Option(
        ...,
        "--model-dir",
        help="Model directory, passed to vLLM as --model (e.g. one built by `pdorch dev "
        "tiny-model`).",
    ),
    role: str = typer.Option(
        ...,
        "--role",
        help="prefill, decode or both. Every engine is NixlConnector `kv_both` (it can serve "
        "either leg or a colocated request); the role names its pool.",
    ),
    port: int = typer.Option(0, "--port", help="HTTP port; 0 picks a free one."),
    host: str = typer.Option("127.0.0.1", "--host", help="HTTP bind address."),
    served_model_name: str | None = typer.Option(
        None,
        "--served-model-name",
        help="Model name clients send (vLLM --served-model-name); default: the directory name.",
    ),
    side_channel_port: int = typer.Option(
        0, "--side-channel-port", help="NIXL handshake port; 0 picks a free one."
    ),
    side_channel_host: str = typer.Option(
        "127.0.0.1", "--side-channel-host", help="Address decode engines reach the handshake on."
    ),
    host_ip: str | None = typer.Option(
        None,
        "--host-ip",
        help="Address other engines reach this one on (VLLM_HOST_IP); default: the "
        "side-channel host. Set it on multi-host fleets.",
    ),
    kv_events_endpoint: str | None = typer.Option(
        None,
        "--kv-events-endpoint",
        help="ZMQ endpoint for KV events. ipc:// or tcp://*:PORT makes the engine bind; "
        "tcp://HOST:PORT makes it connect to a subscriber that binds. Default: no events.",
    ),
    kv_events_replay_endpoint: str | None = typer.Option(
        None,
        "--kv-events-replay-endpoint",
        help="ZMQ ROUTER endpoint for event replay; default: no replay.",
    ),
    kv_events_topic: str = typer.Option("kv-events", "--kv-events-topic", help="Event topic."),
    block_size: int = typer.Option(
        32, "--block-size", help="Tokens per KV block (a multiple of 32 on CPU)."
    ),
    max_model_len: int = typer.Option(2048, "--max-model-len", help="Max prompt+output tokens."),
    cpu_core: str | None = typer.Option(
        None,
        "--cpu-core",
        help="CPU core(s) for the engine's threads, e.g. 0 or 0-3 (VLLM_CPU_OMP_THREADS_BIND); "
        "pin engines that share a host to different cores. Default: vLLM's choice.",
    ),
    kv_cache_space_gib: int = typer.Option(
        1, "--kv-cache-space-gib", help="KV cache GiB on CPU (VLLM_CPU_KVCACHE_SPACE)."
    ),
    num_gpu_blocks: int | None = typer.Option(
        None,
        "--num-gpu-blocks",
        help="Fix the KV pool to N blocks (vLLM --num-gpu-blocks-override; small N forces "
        "evictions). Default: sized from --kv-cache-space-gib / GPU memory.",
    ),
    device: str = typer.Option("cpu", "--device", help="cpu (vllm-cpu) or cuda."),
    gpu_ids: list[str] | None = typer.Option(
        None,
        "--gpu-ids",
        metavar="ID,...",
        help="GPU ids for CUDA_VISIBLE_DEVICES, comma-separated or repeated (0,1); cuda only. "
        "Default: every visible GPU.",
    ),
    dtype: str = typer.Option("bfloat16", "--dtype", help="bfloat16, float16, float32 or auto."),
    enforce_eager: bool = typer.Option(
        True, "--enforce-eager/--no-enforce-eager", help="Skip graph compilation (~40 s saved)."
    ),
    kv_transfer: bool = typer.Option(
        True,
        "--kv-transfer/--no-kv-transfer",
        help="Load NixlConnector (kv_both). --no-kv-transfer: a colocated-only engine (no P/D "
        "legs), e.g. to profile the engine without the connector's CPU cost.",
    ),
    kv_lease_s: int | None = typer.Option(
        None,
        "--kv-lease-s",
        help="Seconds a prefill engine holds unpulled KV; default: vLLM's (30 s).",
    ),
    vllm_arg: list[str] | None = typer.Option(
        None,
        "--vllm-arg",
        help="Extra vLLM flag, verbatim (--vllm-arg=--max-num-seqs=8); repeat for several "
        "(never split at commas).",
    ),
    log_file: Path | None = typer.Option(
        None, "--log-file", help="Engine log; default: a file in the temp dir (path on stderr)."
    ),
    start_timeout_s: float = typer.Option(
        600.0, "--start-timeout-s", help="Seconds to wait for /health before giving up."
    ),
) -> None:
    """Start a vLLM engine, print `ready <url>` when healthy, stop it on SIGINT/SIGTERM.

    Example: `pdorch engine vllm --model-dir .cache/tiny-model --role prefill`
    """
    from pydantic import ValidationError
    from rich.console import Console

    from pools.ports import free_ports
    from pools.vllm_process import RunningVllm, VllmEngineError
    from pools.vllm_spec import VllmEngineSpec

    console = Console(stderr=True)
    picked = iter(free_ports(2))
    try:
        # model_validate: pydantic checks the choices (role, dtype, device) and names the field.
        spec = VllmEngineSpec.model_validate(
            {
                "role": role,
                "model": model_dir,
                "served_model_name": served_model_name,
                "host": host,
                "port": port or next(picked),
                "side_channel_host": side_channel_host,
                "side_channel_port": side_channel_port or next(picked),
                "host_ip": host_ip,
                "kv_transfer": kv_transfer,
                "kv_lease_s": kv_lease_s,
                "kv_events_endpoint": kv_events_endpoint,
                "kv_events_replay_endpoint": kv_events_replay_endpoint,
                "kv_events_topic": kv_events_topic,
                "block_size": block_size,
                "max_model_len": max_model_len,
                "cpu_cores": cpu_core,
                "kv_cache_space_gib": kv_cache_space_gib,
                "num_gpu_blocks_override": num_gpu_blocks,
                "enforce_eager": enforce_eager,
                "dtype": dtype,
                "device": device,
                "gpu_ids": None if gpu_ids is None else split_ints(gpu_ids, "--gpu-ids"),
                "extra_args": vllm_arg or [],
            }
        )
    except (ValidationError, ValueError) as exc:
        console.print(f"[red]invalid engine settings:[/red] {exc}")
        raise typer.Exit(code=2) from None

    if log_file is None:
        log_dir = Path(tempfile.gettempdir())
        log_file = log_dir / f"pdorch-vllm-{spec.role}-{spec.port}.log"
    engine = RunningVllm(spec, log_file)
    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        console.print(
            f"starting vLLM {spec.role} engine on {spec.url} "
            f"(side channel {spec.side_channel_host}:{spec.side_channel_port}); log: {log_file}"
        )
        engine.start()
        engine.wait_healthy(start_timeout_s)
        sys.stdout.write(f"ready {engine.url}\n")
        sys.stdout.flush()
        while True:
            engine.check_alive()
            time.sleep(1.0)  # a signal interrupts this via _StopRequested
    except _StopRequested as stop:
        console.print(f"{stop}: stopping the engine")
    except VllmEngineError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(code=1) from None
    finally:
        # A second signal must not interrupt the stop half-way and orphan the engine group.
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        engine.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
