"""Proxy overhead: P/D req/s and added latency through pdorch vs vllm-router vs no proxy.

Setup (one run, one set of engines): a prefill and a decode simulated engine (`pdorch engine
sim`, separate processes, `--time-scale` tiny so they answer almost at once and the proxy is
the bottleneck), then for every concurrency C and every target, `requests` completions
(short unique prompt, `max_tokens` small) from C workers, each on its own keep-alive
connection (`benchmarks/proxy/raw_http.py`, a lean client so the generator is not the
bottleneck). With `stream` (`--stream`) the answers are SSE: the decode leg streams, the
proxy relays every event, and each answer must end with `data: [DONE]` after at least
`max_tokens` events (long streams, e.g. `--max-tokens 256`, measure the relay's per-chunk
cost). With `py_spy_dir` (`--py-spy-dir`) a `py-spy record --nonblocking` flame graph of the
pdorch process (each pdorch target) is written per C for the timed requests.

- `direct`: no proxy. The client does the two legs itself, exactly as a P/D proxy must: the
  prefill leg to the prefill engine (`max_tokens: 1`, `kv_transfer_params.do_remote_decode`),
  then the decode leg (streamed with `stream`) to the decode engine with the returned
  `kv_transfer_params` and the same `X-Request-Id`. This is the floor every proxy adds to.
- `vllm-router`: `vllm-router --vllm-pd-disaggregation --prefill P --decode D` (Rust; NIXL mode).
- `pdorch`: `pdorch serve --config` over the same two engines, every request disaggregated.
- `pdorch-aiohttp`, `pdorch-native`: `pdorch serve` with `coordinator.leg_client` pinned to
  that leg client (`pdorch/app/upstream.py`, `pdorch/app/leg_client.py`), side by side with
  `pdorch` (the fleet file's default) in one run.
- `pdorch-wN` (`workers`, `--workers 1,2`): `pdorch serve --workers N` over the same engines:
  N coordinator processes on one port (SO_REUSEPORT); its CPU is the supervisor's and every
  worker's (children of the measured process).

Rounds (`rounds`, `--rounds R`): per C, the `requests` timed completions of each target are
split into R rounds and the targets take turns round by round (warm-up before the first), so
a load swing on a shared machine hits every target alike; a row sums its rounds (latencies
pooled, wall and CPU summed) and lists each round's req/s (`rps_rounds`, the spread). One
sequential pass per target (R = 1) was ±30 % between back-to-back runs on a loaded 2-core box
(`benchmarks/results/proxy.md`). The py-spy flame graph covers the first round.

Measured per (target, C): req/s = ok requests / wall time; latency percentiles (client-side,
whole request); added latency = the target's percentile - direct's at the same C; CPU spent per
request by the client, the proxy process and the engines (psutil): on a small machine all of
them share the cores, so CPU per request says which proxy is cheaper even when req/s is
limited by the machine. `remote_prefill_frac` = the decode engine's prompt tokens pulled over
KV transfer / all its prompt tokens in that run (1.0 proves every request really was P/D).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgspec

from benchmarks.proxy.processes import (
    RunningProcess,
    pdorch_serve_available,
    start_pdorch,
    start_sim,
    start_vllm_router,
    stop_process,
    venv_bin,
    write_pdorch_fleet,
)
from benchmarks.proxy.raw_http import RawHttpConnection, split_url
from benchmarks.proxy.rounds import RunResult as _RunResult
from benchmarks.proxy.rounds import Totals as _Totals
from benchmarks.proxy.rounds import add_comparisons as _add_comparisons
from benchmarks.proxy.rounds import round_sizes as _round_sizes
from benchmarks.proxy.rounds import row as _row
from pools.http_client import http_client
from pools.pd_protocol import PREFILL_KV_TRANSFER_PARAMS
from pools.ports import free_port

TARGETS = ("direct", "vllm-router", "pdorch", "pdorch-aiohttp", "pdorch-native")
DEFAULT_TARGETS = ("direct", "vllm-router", "pdorch")
LEG_CLIENT_TARGETS = {"pdorch-aiohttp": "aiohttp", "pdorch-native": "native"}
_PREFILL_KV = PREFILL_KV_TRANSFER_PARAMS.wire()
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


@dataclass(frozen=True)
class ProxyBenchConfig:
    requests: int = 2000
    concurrency: tuple[int, ...] = (1, 32)
    targets: tuple[str, ...] = DEFAULT_TARGETS
    max_tokens: int = 4
    warmup: int = 50
    time_scale: float = 0.0001
    model_profile: str = "tiny"
    served_model_name: str = "bench-model"
    log_dir: Path | None = None
    stream: bool = False  # SSE answers (`stream: true`): the relay's per-chunk cost
    py_spy_dir: Path | None = None  # record pdorch's flame graph per C here (py-spy)
    # `pdorch serve --workers N` per value: target `pdorch` for 1, `pdorch-wN` for N > 1
    workers: tuple[int, ...] = (1,)
    # interleaved rounds per C (module docstring, "Rounds"); 1: each target once, in turn
    rounds: int = 1


class _Worker:
    """One concurrent client: its own keep-alive connection(s) to the target."""

    def __init__(
        self, target: str, urls: dict[str, str], model: str, max_tokens: int, stream: bool
    ) -> None:
        self.target = target
        self.model = model
        self.max_tokens = max_tokens
        self.stream = stream
        self.conns = {name: RawHttpConnection(*split_url(url)[:2]) for name, url in urls.items()}

    async def request(self, prompt: str) -> str | None:
        """One P/D completion; None when it succeeded, else the error."""
        if self.target != "direct":
            request: dict[str, Any] = {
                "model": self.model,
                "prompt": prompt,
                "max_tokens": self.max_tokens,
            }
            if self.stream:
                request["stream"] = True
            status, data = await self.conns["proxy"].post_json("/v1/completions", _encode(request))
            return self._check(status, data)
        rid = {"X-Request-Id": f"bench-{uuid.uuid4().hex}"}
        prefill = _encode(
            {
                "model": self.model,
                "prompt": prompt,
                "max_tokens": 1,
                "stream": False,
                "kv_transfer_params": _PREFILL_KV,
            }
        )
        status, data = await self.conns["prefill"].post_json("/v1/completions", prefill, rid)
        if status != 200:
            return f"prefill HTTP {status}: {data[:200]!r}"
        # passed on as the JSON it came in: the floor does no more work than any proxy must
        params = _decode(data).get("kv_transfer_params")
        if not params:
            return "prefill response without kv_transfer_params"
        decode_leg: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": self.max_tokens,
            "kv_transfer_params": params,
        }
        if self.stream:
            decode_leg["stream"] = True
        status, data = await self.conns["decode"].post_json(
            "/v1/completions", _encode(decode_leg), rid
        )
        return self._check(status, data)

    def _check(self, status: int, data: bytes) -> str | None:
        """None for a whole answer: 200, and a streamed one ends with `[DONE]` after
        `max_tokens` token events (a relay that drops or merges events fails here)."""
        if status != 200:
            return f"HTTP {status}: {data[:200]!r}"
        if not self.stream:
            return None
        if not data.endswith(b"data: [DONE]\n\n"):
            return f"stream without [DONE]: {data[-200:]!r}"
        events = data.count(b"data: ") - 1
        if events < self.max_tokens:
            return f"stream with {events} events for max_tokens={self.max_tokens}"
        return None

    def close(self) -> None:
        for conn in self.conns.values():
            conn.close()


async def _drive(
    target: str,
    urls: dict[str, str],
    config: ProxyBenchConfig,
    concurrency: int,
    count: int,
    tag: str,
    on_done: Callable[[], None] | None,
) -> _RunResult:
    result = _RunResult()
    counter = itertools.count()
    workers = [
        _Worker(target, urls, config.served_model_name, config.max_tokens, config.stream)
        for _ in range(concurrency)
    ]

    async def loop(worker: _Worker) -> None:
        while (i := next(counter)) < count:
            # Unique prompts: no prefix-cache hit makes one target's engines do less work.
            prompt = f"{i} {tag}: say something short about the sea."
            start = time.perf_counter()
            try:
                error = await worker.request(prompt)
            except (OSError, asyncio.IncompleteReadError, RuntimeError, ValueError) as err:
                error = f"{type(err).__name__}: {err}"
                worker.close()
            if error is None:
                result.latencies_s.append(time.perf_counter() - start)
            else:
                result.errors.append(error)
            if on_done is not None:
                on_done()

    start = time.perf_counter()
    try:
        await asyncio.gather(*(loop(w) for w in workers))
    finally:
        for worker in workers:
            worker.close()
    result.wall_s = time.perf_counter() - start
    return result


def _start_py_spy(
    config: ProxyBenchConfig, target: str, proc: RunningProcess | None, concurrency: int
) -> subprocess.Popen[bytes] | None:
    """`py-spy record` on the pdorch process for one timed run (`py_spy_dir`), else None.
    `--nonblocking`: the process is not paused per sample (its CPU/req stays comparable,
    a few samples may be torn); `--idle` off: only stacks that run on a core count."""
    if config.py_spy_dir is None or not target.startswith("pdorch") or proc is None:
        return None
    config.py_spy_dir.mkdir(parents=True, exist_ok=True)
    kind = "stream" if config.stream else "whole"
    out = config.py_spy_dir / f"{target}-{kind}-c{concurrency}.svg"
    cmd = [venv_bin("py-spy"), "record", "--nonblocking", "--rate", "200"]
    cmd += ["--pid", str(proc.pid), "--output", str(out)]
    log = (config.py_spy_dir / f"py-spy-{target}-{kind}-c{concurrency}.log").open("wb")
    with log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


def _stop_py_spy(spy: subprocess.Popen[bytes]) -> None:
    """SIGINT makes py-spy write the flame graph and exit."""
    spy.send_signal(signal.SIGINT)
    try:
        spy.wait(60)
    except subprocess.TimeoutExpired:
        spy.kill()
        spy.wait(10)


def _cpu_s(pids: Sequence[int]) -> float:
    """User + system CPU seconds of the processes (and their children) so far."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            for p in (proc, *proc.children(recursive=True)):
                times = p.cpu_times()
                total += times.user + times.system
        except psutil.Error:
            continue
    return total


_SOURCE_RE = re.compile(r"^vllm:prompt_tokens_by_source_total\{([^}]*)\}\s+(\S+)", re.M)


async def _decode_prompt_sources(client: httpx.AsyncClient, decode_url: str) -> dict[str, float]:
    """source label → prompt tokens so far, from the decode engine's `/metrics`."""
    text = (await client.get(decode_url + "/metrics")).text
    out: dict[str, float] = {}
    for labels, value in _SOURCE_RE.findall(text):
        source = re.search(r'source="([^"]*)"', labels)
        if source:
            out[source.group(1)] = out.get(source.group(1), 0.0) + float(value)
    return out


async def run_proxy_bench(
    config: ProxyBenchConfig,
    *,
    on_progress: Callable[[], None] | None = None,
    on_status: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Start engines and proxies, run every (C, target), stop everything; the JSON report."""
    say = on_status or (lambda _msg: None)
    log_dir = config.log_dir or Path(tempfile.mkdtemp(prefix="pdorch-bench-proxy-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    skipped: dict[str, str] = {}
    notes: dict[str, str] = {}
    load_before = os.getloadavg()[0]
    started: list[RunningProcess] = []
    rows: list[dict[str, Any]] = []
    try:
        say("starting simulated engines (prefill, decode)")
        sims = await asyncio.gather(
            *(
                start_sim(
                    role,
                    log_dir,
                    time_scale=config.time_scale,
                    model_profile=config.model_profile,
                    served_model_name=config.served_model_name,
                    kv_events_port=free_port(),
                )
                for role in ("prefill", "decode")
            ),
            return_exceptions=True,
        )
        started += [sim for sim in sims if isinstance(sim, RunningProcess)]
        for sim in sims:
            if isinstance(sim, BaseException):
                raise sim
        prefill, decode = (sim for sim in sims if isinstance(sim, RunningProcess))
        targets: dict[str, tuple[dict[str, str], RunningProcess | None]] = {}
        if "direct" in config.targets:
            targets["direct"] = ({"prefill": prefill.url, "decode": decode.url}, None)
        if "vllm-router" in config.targets:
            say("starting vllm-router")
            try:
                router = await start_vllm_router(prefill.url, decode.url, log_dir)
                started.append(router)
                targets["vllm-router"] = ({"proxy": router.url}, router)
            except (OSError, RuntimeError) as err:
                skipped["vllm-router"] = str(err)
        if "pdorch" in config.targets:
            # `pdorch serve` when this checkout has it, else the same app path without the CLI
            launcher = "pdorch serve" if pdorch_serve_available() is None else "pdorch_runner"
            say(f"starting pdorch ({launcher})")
            port = free_port()
            fleet = log_dir / "fleet-bench.yaml"
            write_pdorch_fleet(
                fleet,
                served_model_name=config.served_model_name,
                prefill=prefill,
                decode=decode,
                port=port,
            )
            for workers in config.workers:
                name = "pdorch" if workers == 1 else f"pdorch-w{workers}"
                try:
                    coordinator = await start_pdorch(
                        fleet,
                        port if workers == 1 else free_port(),
                        log_dir,
                        use_serve=launcher == "pdorch serve",
                        workers=workers,
                    )
                    started.append(coordinator)
                    targets[name] = ({"proxy": coordinator.url}, coordinator)
                    notes["pdorch_launcher"] = launcher
                except (OSError, RuntimeError) as err:
                    skipped[name] = str(err)
        for name, leg_client in LEG_CLIENT_TARGETS.items():
            if name not in config.targets:
                continue
            say(f"starting {name}")
            port = free_port()
            fleet = log_dir / f"fleet-bench-{leg_client}.yaml"
            write_pdorch_fleet(
                fleet,
                served_model_name=config.served_model_name,
                prefill=prefill,
                decode=decode,
                port=port,
                leg_client=leg_client,
            )
            try:
                coordinator = await start_pdorch(
                    fleet, port, log_dir, use_serve=pdorch_serve_available() is None, name=name
                )
                started.append(coordinator)
                targets[name] = ({"proxy": coordinator.url}, coordinator)
            except (OSError, RuntimeError) as err:
                skipped[name] = str(err)
        engine_pids = [prefill.pid, decode.pid]
        async with http_client(timeout=10.0) as http:
            for concurrency in config.concurrency:
                runs = {name: _Totals() for name in targets}
                for round_no, count in enumerate(_round_sizes(config.requests, config.rounds)):
                    for name in targets:  # direct, vllm-router, pdorch, pdorch-wN, in turn
                        urls, proc = targets[name]
                        say(f"{name} at concurrency {concurrency}, round {round_no + 1}")
                        tag = uuid.uuid4().hex[:8]
                        if config.warmup and round_no == 0:
                            await _drive(
                                name, urls, config, concurrency, config.warmup, f"warm{tag}", None
                            )
                        sources0 = await _decode_prompt_sources(http, decode.url)
                        client0 = time.process_time()
                        proxy0 = _cpu_s([proc.pid]) if proc else 0.0
                        engines0 = _cpu_s(engine_pids)
                        spy = (
                            _start_py_spy(config, name, proc, concurrency) if not round_no else None
                        )
                        try:
                            run = await _drive(
                                name, urls, config, concurrency, count, tag, on_progress
                            )
                        finally:
                            if spy is not None:
                                _stop_py_spy(spy)
                        runs[name].add(
                            run,
                            time.process_time() - client0,
                            _cpu_s([proc.pid]) - proxy0 if proc else None,
                            _cpu_s(engine_pids) - engines0,
                            sources0,
                            await _decode_prompt_sources(http, decode.url),
                        )
                rows += [_row(name, concurrency, runs[name]) for name in targets]
    finally:
        for proc in reversed(started):
            stop_process(proc)
    _add_comparisons(rows)
    return {
        "rows": rows,
        "skipped": skipped,
        "config": {
            "requests": config.requests,
            "concurrency": list(config.concurrency),
            "max_tokens": config.max_tokens,
            "stream": config.stream,
            "warmup": config.warmup,
            "time_scale": config.time_scale,
            "model_profile": config.model_profile,
            "workers": list(config.workers),
            "rounds": config.rounds,
            "cpus": os.cpu_count(),
            # other work on the machine skews req/s; CPU µs per request much less so
            "loadavg_1m_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        },
        "versions": _versions(),
        "notes": notes,
        "log_dir": str(log_dir),
    }


def _versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for dist in ("vllm-router", "pdorch"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = None
    return out
