"""`pdorch engine sim`: one simulated vLLM engine in the foreground.

Prints exactly one line `ready <http-url>` on stdout once the server accepts requests (logs go
to stderr) and stops cleanly on SIGINT/SIGTERM.
"""

from __future__ import annotations

from typing import Literal

import typer

# The choices as Literals, so typer checks them on the command line and the function converts
# them to `EngineRole` / `KvTransport` typed; the enums themselves are imported inside the
# function (`transfer` costs ~0.2 s to import, and `pdorch --help` must stay fast).
# tests/cli/test_engine_sim_choices.py keeps them equal to the enums.
RoleName = Literal["prefill", "decode", "both"]
KvTransportName = Literal["auto", "nixl", "tcp", "none"]

RENAMED = {
    "--kv-memory-gb": "--kv-memory-gib",
    "--kv-host": "--side-channel-host",  # the name `engine vllm` uses for the same thing
    "--kv-port": "--side-channel-port",
}
"""Old flag spellings, accepted as hidden aliases for one release (pdorch/cli/options.py)."""


def engine_sim(
    role: RoleName = typer.Option(
        "both",
        help="prefill | decode | both. Like vLLM's kv_both, any engine still serves every kind "
        "of request; the role tells the pool what to route to it.",
    ),
    host: str = typer.Option("127.0.0.1", help="HTTP bind address."),
    port: int = typer.Option(
        0,
        help="HTTP port; 0 (the default) lets the OS pick one, printed on the ready line. "
        "Engines never default to 8000, the port of `pdorch serve`.",
    ),
    model_profile: str = typer.Option(
        "tiny", help="Model profile for timing and KV size (see `pdorch profile`)."
    ),
    gpu: str = typer.Option("h100", help="GPU profile: h100, h200, a100, l40s, b200, cpu."),
    tp: int = typer.Option(1, help="Tensor-parallel degree."),
    kv_memory_gib: float | None = typer.Option(
        None,
        "--kv-memory-gib",
        help="KV pool per GPU in GiB (2^30 bytes). Default: vLLM's memory accounting for the GPU "
        "(see `pdorch profile`).",
    ),
    time_scale: float = typer.Option(
        1.0, help="Real seconds per simulated second (0.01 = 100x faster than the GPU)."
    ),
    block_size: int = typer.Option(16, help="Tokens per KV block (vLLM --block-size)."),
    num_blocks: int | None = typer.Option(
        None,
        help="KV blocks incl. the null block (vLLM --num-gpu-blocks-override). Default: "
        "the KV pool (--kv-memory-gib) over the block size.",
    ),
    max_num_seqs: int = typer.Option(256, help="Max running sequences per step."),
    max_num_batched_tokens: int = typer.Option(8192, help="Token budget per step."),
    max_model_len: int = typer.Option(8192, help="Longest prompt + output, in tokens."),
    enable_prefix_caching: bool = typer.Option(
        True,
        "--enable-prefix-caching/--no-enable-prefix-caching",
        help="Prefix caching (vLLM's flag of the same name).",
    ),
    kv_events_endpoint: str | None = typer.Option(
        None,
        help="ZMQ endpoint for KV events, e.g. tcp://*:5557 (bind) or tcp://127.0.0.1:5557 "
        "(connect to a binding subscriber), as vLLM decides. Default: no events.",
    ),
    kv_events_replay_endpoint: str | None = typer.Option(
        None, help="ZMQ ROUTER endpoint that replays buffered event batches; default: none."
    ),
    kv_events_topic: str = typer.Option("kv-events", help="Topic frame of every event message."),
    served_model_name: str | None = typer.Option(
        None, help="Model name clients use (default: the model profile)."
    ),
    tokenizer: str | None = typer.Option(
        None,
        help="Local Hugging Face tokenizer directory (e.g. the tiny model's). Default: a "
        "byte-level fallback (id = byte + 3, BOS 1, EOS 2).",
    ),
    lora_modules: list[str] | None = typer.Option(
        None,
        "--lora-modules",
        metavar="NAME[=PATH],...",
        help="LoRA adapters the engine has loaded, each `name` or `name=path` (vLLM's flag), "
        "comma-separated or repeated. Requests naming one run with it (block hashes salted "
        "as vLLM's); /v1/models lists them. Default: none.",
    ),
    engine_id: str | None = typer.Option(None, help="KV engine id (default: random uuid)."),
    kv_transport: KvTransportName = typer.Option(
        "auto", help="How KV blocks move between engines: auto | nixl | tcp | none."
    ),
    side_channel_host: str = typer.Option(
        "127.0.0.1",
        "--side-channel-host",
        help="Address peers reach the KV side channel on (as `engine vllm`).",
    ),
    side_channel_port: int = typer.Option(
        0, "--side-channel-port", help="KV side-channel port; 0 picks a free one."
    ),
    kv_block_bytes: int = typer.Option(
        4096, help="Real bytes moved per KV block (scaled down from the profile's)."
    ),
    kv_lease_s: float = typer.Option(
        30.0, help="Seconds a prefill engine holds blocks nobody has pulled."
    ),
    kv_load_timeout_s: float = typer.Option(
        5.0, help="Seconds a decode engine waits for a KV pull before answering 500."
    ),
    log_level: str = typer.Option("warning", help="Log level for stderr."),
) -> None:
    """Run a simulated vLLM engine: vLLM's HTTP API, metrics, KV events and P/D protocol,
    with GPU-profile timing and no GPU.

    Example: `pdorch engine sim --role decode --model-profile llama-3.1-8b --time-scale 0.01`
    """
    import asyncio
    import logging
    import signal
    import sys

    from pydantic import ValidationError

    from pdorch.cli.options import split_list
    from pools.launch_engines import SIM_FLAG_OF_FIELD
    from pools.roles import EngineRole
    from pools.sim.server import SimServer
    from pools.sim.settings import SimEngineSettings
    from transfer.transports import KvTransport

    logging.basicConfig(level=log_level.upper(), stream=sys.stderr)
    try:
        settings = SimEngineSettings(
            role=EngineRole(role),
            host=host,
            port=port,
            model_profile=model_profile,
            gpu=gpu,
            tp=tp,
            kv_memory_gb=kv_memory_gib,
            time_scale=time_scale,
            block_size=block_size,
            num_blocks=num_blocks,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
            enable_prefix_caching=enable_prefix_caching,
            served_model_name=served_model_name,
            tokenizer=tokenizer,
            lora_modules=split_list(lora_modules, "--lora-modules") if lora_modules else [],
            kv_events_endpoint=kv_events_endpoint,
            kv_events_replay_endpoint=kv_events_replay_endpoint,
            kv_events_topic=kv_events_topic,
            kv_events_buffer_steps=10_000,
            engine_id=engine_id,
            kv_transport=KvTransport(kv_transport),
            kv_host=side_channel_host,
            kv_port=side_channel_port,
            kv_block_bytes=kv_block_bytes,
            kv_lease_s=kv_lease_s,
            kv_load_timeout_s=kv_load_timeout_s,
        )
    except ValidationError as exc:
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"])
            flag = SIM_FLAG_OF_FIELD.get(field, "--" + field.replace("_", "-"))
            print(f"{flag}: {err['msg']}", file=sys.stderr)
        raise typer.Exit(code=2) from None

    async def serve() -> None:
        server = SimServer(settings)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            url = await server.start()
            print(f"ready {url}", flush=True)
            await stop.wait()
        finally:
            await server.stop()

    try:
        asyncio.run(serve())
    except (KeyError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise typer.Exit(code=2) from None
