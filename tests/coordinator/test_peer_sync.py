"""Token-load sharing between coordinators: real ZMQ pub/sub on loopback, real `TokenLoad`s."""

from __future__ import annotations

import random
import re
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import zmq
import zmq.asyncio

from pdorch.sync import PeerSync, SyncSettings
from pdorch.sync.wire import TOPIC, SyncMessage, WireEntry, decode_message, encode_message
from pools.http_client import http_client
from router.token_load import TokenLoad
from tests.ports import free_port
from tests.waiting import async_wait_until

BS = 16


def loads(token_load: TokenLoad, replica: str) -> tuple[int, int, int]:
    snap = token_load.load(replica, time.monotonic())
    return (snap.prefill_tokens_queued, snap.decode_blocks, snap.requests_in_flight)


def admit(token_load: TokenLoad, rid: str, replica: str, prompt: int, uncached: int) -> None:
    token_load.on_admitted(
        rid,
        replica,
        time.monotonic(),
        prompt_tokens=prompt,
        uncached_tokens=uncached,
        block_size=BS,
    )


async def converged(
    a: TokenLoad, b: TokenLoad, replicas: list[str], expect: Callable[[str], tuple[int, int, int]]
) -> None:
    async def check() -> bool:
        return all(loads(b, r) == expect(r) for r in replicas)

    await async_wait_until(check, timeout=5.0, message="B's view of A's load")


class Coordinator:
    """One coordinator's sharing state: its TokenLoad and its PeerSync."""

    def __init__(self, origin: str, bind: str, peers: list[str], **settings: Any) -> None:
        self.load = TokenLoad(origin=origin)
        self.sync = PeerSync.for_token_load(
            self.load, SyncSettings(bind=bind, peers=peers, **settings)
        )


@pytest.fixture
async def pair() -> AsyncIterator[tuple[Coordinator, Coordinator]]:
    ea, eb = (f"tcp://127.0.0.1:{free_port()}" for _ in range(2))
    # One shared peer list, as one fleet file gives it: each skips its own endpoint.
    a = Coordinator("coord-a", ea, [ea, eb], peer_timeout_s=0.6, heartbeat_interval_s=0.1)
    b = Coordinator("coord-b", eb, [ea, eb], peer_timeout_s=0.6, heartbeat_interval_s=0.1)
    await a.sync.start()
    await b.sync.start()
    try:
        yield a, b
    finally:
        await a.sync.stop()
        await b.sync.stop()


async def test_lifecycle_on_a_converges_on_b(pair: tuple[Coordinator, Coordinator]) -> None:
    a, b = pair
    admit(a.load, "r1", "decode-0", prompt=1000, uncached=600)
    admit(a.load, "r2", "prefill-0", prompt=64, uncached=64)
    a.sync.flush_soon()
    await converged(a.load, b.load, ["decode-0", "prefill-0"], lambda r: loads(a.load, r))
    assert loads(b.load, "decode-0") == (600, 0, 1)

    now = time.monotonic()
    a.load.on_prefill_done("r1", "decode-0", now)
    a.load.on_tokens("r1", "decode-0", now, generated_total=24)
    a.load.on_finished("r2", now)
    a.sync.flush_soon()
    await converged(a.load, b.load, ["decode-0", "prefill-0"], lambda r: loads(a.load, r))
    assert loads(b.load, "decode-0") == (0, 64, 1)
    assert loads(b.load, "prefill-0") == (0, 0, 0)

    # B's own traffic reaches A the same way, and neither counts its own load twice.
    admit(b.load, "rb", "decode-0", prompt=32, uncached=32)
    b.sync.flush_soon()
    await converged(b.load, a.load, ["decode-0"], lambda r: loads(b.load, r))
    assert loads(a.load, "decode-0") == (32, 64, 2)
    assert a.sync.stats.own_messages_ignored == 0  # own endpoint skipped, not looped back


async def test_abort_on_a_releases_on_b(pair: tuple[Coordinator, Coordinator]) -> None:
    a, b = pair
    admit(a.load, "r1", "decode-0", prompt=512, uncached=512)
    a.sync.flush_soon()
    await converged(a.load, b.load, ["decode-0"], lambda r: (512, 0, 1))
    a.load.on_aborted("r1", time.monotonic())
    a.sync.flush_soon()
    await converged(a.load, b.load, ["decode-0"], lambda r: (0, 0, 0))
    assert b.sync.peers() == {"coord-a": 0}


async def test_duplicate_and_out_of_order_deliveries_are_idempotent() -> None:
    """A raw PUB (real ZMQ) replays A's recorded messages duplicated and shuffled to B."""
    a_load = TokenLoad(origin="coord-a")
    now = time.monotonic()
    admit(a_load, "r1", "decode-0", prompt=320, uncached=320)
    admit(a_load, "r2", "decode-0", prompt=160, uncached=0)
    batches = [a_load.export_deltas()]
    a_load.on_prefill_done("r1", "decode-0", now)
    batches.append(a_load.export_deltas())
    a_load.on_tokens("r1", "decode-0", now, generated_total=16)
    a_load.on_finished("r2", now)
    batches.append(a_load.export_deltas())
    expected = loads(a_load, "decode-0")
    assert expected == (0, 21, 1)  # ceil((320 + 16) / 16)

    recorder = PeerSync(SyncSettings(), "coord-a", lambda d, n: None, lambda r, p, n: None)
    payloads = []
    for seq, batch in enumerate(batches, start=1):
        recorder.publish(batch)
        entries = [WireEntry(e.request_id, e.replica_id, e.version, e.removed,
                             e.prefill_tokens, e.decode_blocks) for e in batch]  # fmt: skip
        message = SyncMessage("coord-a", "inc-1", seq, "delta", max(e.version for e in batch),
                              entries)  # fmt: skip
        payloads.append(encode_message(message))
    delivered = payloads * 3
    random.Random(7).shuffle(delivered)

    endpoint = f"tcp://127.0.0.1:{free_port()}"
    ctx = zmq.asyncio.Context()
    pub = ctx.socket(zmq.XPUB)
    pub.bind(endpoint)
    b = Coordinator("coord-b", "tcp://127.0.0.1:0", [endpoint])
    await b.sync.start()
    try:
        assert (await pub.recv())[:1] == b"\x01"  # B subscribed: deliveries are not dropped
        for payload in delivered:
            await pub.send_multipart([TOPIC, payload])
        await converged(a_load, b.load, ["decode-0"], lambda r: expected)

        async def all_received() -> bool:
            return b.sync.stats.messages_received == len(delivered)

        await async_wait_until(all_received, timeout=5.0, message="every delivery")
        assert loads(b.load, "decode-0") == expected
        assert b.sync.peers() == {"coord-a": 1}
    finally:
        await b.sync.stop()
        pub.close(linger=0)
        ctx.term()


async def test_late_joiner_gets_a_snapshot() -> None:
    ea, eb = (f"tcp://127.0.0.1:{free_port()}" for _ in range(2))
    a = Coordinator("coord-a", ea, [], snapshot_interval_s=30.0)
    await a.sync.start()
    admit(a.load, "r1", "decode-0", prompt=160, uncached=160)
    admit(a.load, "r2", "decode-1", prompt=160, uncached=160)
    a.sync.flush_soon()

    async def a_sent() -> bool:
        return a.sync.stats.entries_sent >= 2

    await async_wait_until(a_sent, timeout=5.0, message="A's first deltas (to nobody)")
    b = Coordinator("coord-b", eb, [ea])
    await b.sync.start()
    try:
        # Not the periodic snapshot (30 s): A saw B subscribe and sent its state at once.
        await converged(a.load, b.load, ["decode-0", "decode-1"], lambda r: (160, 0, 1))
    finally:
        await b.sync.stop()
        await a.sync.stop()


@pytest.mark.unit
def test_snapshot_repairs_a_lost_removal() -> None:
    b = TokenLoad(origin="coord-b")
    sync = PeerSync.for_token_load(b, SyncSettings())
    now = time.monotonic()
    live = [
        WireEntry("r1", "decode-0", 1, False, 160, 0),
        WireEntry("r2", "decode-0", 2, False, 32, 0),
    ]
    sync.handle_payload(encode_message(SyncMessage("coord-a", "i", 1, "delta", 2, live)), now)
    assert loads(b, "decode-0") == (192, 0, 2)
    # r2's removal (version 3) is lost; a later snapshot (high water 4) lacks r2.
    snapshot = [WireEntry("r1", "decode-0", 4, False, 0, 10)]
    sync.handle_payload(
        encode_message(SyncMessage("coord-a", "i", 3, "snapshot", 4, snapshot)), now
    )
    assert loads(b, "decode-0") == (0, 10, 1)
    assert sync.stats.seq_gaps == 1
    # The lost removal arriving late, and r2's stale live record, change nothing.
    late = [WireEntry("r2", "decode-0", 3, True), WireEntry("r2", "decode-0", 2, False, 32, 0)]
    sync.handle_payload(encode_message(SyncMessage("coord-a", "i", 2, "delta", 3, late)), now)
    assert loads(b, "decode-0") == (0, 10, 1)
    # A restarted (new incarnation): its old entries are gone.
    sync.handle_payload(encode_message(SyncMessage("coord-a", "j", 1, "heartbeat", 0)), now)
    assert loads(b, "decode-0") == (0, 0, 0)


async def test_stopped_peer_expires(pair: tuple[Coordinator, Coordinator]) -> None:
    a, b = pair
    admit(a.load, "r1", "decode-0", prompt=320, uncached=320)
    a.sync.flush_soon()
    await converged(a.load, b.load, ["decode-0"], lambda r: (320, 0, 1))
    await a.sync.stop(say_bye=False)  # a crash: nothing more from A, not even `bye`
    await converged(a.load, b.load, ["decode-0"], lambda r: (0, 0, 0))
    assert b.sync.stats.peers_expired == 1
    assert b.sync.peers() == {}


async def test_graceful_stop_says_bye(pair: tuple[Coordinator, Coordinator]) -> None:
    a, b = pair
    b.sync.settings = b.sync.settings.model_copy(update={"peer_timeout_s": 60.0})
    admit(a.load, "r1", "decode-0", prompt=320, uncached=320)
    a.sync.flush_soon()
    await converged(a.load, b.load, ["decode-0"], lambda r: (320, 0, 1))
    await a.sync.stop()
    await converged(a.load, b.load, ["decode-0"], lambda r: (0, 0, 0))
    assert b.sync.stats.peers_expired == 0


@pytest.mark.unit
def test_settings_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match="not a ZMQ endpoint"):
        SyncSettings(peers=["tcp://127.0.0.1:1", "localhost:2"])
    with pytest.raises(ValueError, match="peer_timeout_s"):
        SyncSettings(peer_timeout_s=0.1, heartbeat_interval_s=0.5)


@pytest.mark.unit
def test_cli_sync_overrides_create_or_merge_the_sync_section() -> None:
    """`pdorch serve --sync-bind B --sync-peer P ...` over the fleet file's `sync:` section."""
    from pdorch.config.fleet import FleetConfigError
    from tests.coordinator.helpers import fleet

    plain = fleet()
    assert plain.sync is None
    assert plain.with_sync_overrides() is plain  # nothing given: unchanged

    created = plain.with_sync_overrides("tcp://127.0.0.1:7301", ["tcp://127.0.0.1:7300"])
    assert created.sync == SyncSettings(bind="tcp://127.0.0.1:7301", peers=["tcp://127.0.0.1:7300"])
    assert plain.sync is None  # a copy
    assert created.with_sync_overrides(peers=["tcp://h:1"]).sync == SyncSettings(
        bind="tcp://127.0.0.1:7301", peers=["tcp://127.0.0.1:7300", "tcp://h:1"]
    )

    in_file = fleet(
        sync={"bind": "tcp://a:1", "peers": ["tcp://a:1", "tcp://b:1"], "peer_timeout_s": 9.0}
    )
    merged = in_file.with_sync_overrides("tcp://b:1", ["tcp://c:1", "tcp://a:1"])
    assert merged.sync is not None
    assert merged.sync.bind == "tcp://b:1"  # replaced
    assert merged.sync.peers == ["tcp://a:1", "tcp://b:1", "tcp://c:1"]  # appended, no repeats
    assert merged.sync.peer_timeout_s == 9.0  # the file's other settings kept
    kept = in_file.with_sync_overrides(peers=["tcp://d:1"]).sync
    assert kept is not None and kept.bind == "tcp://a:1"  # no --sync-bind: the file's

    with pytest.raises(FleetConfigError, match=r"command line: sync\.bind: .*not a ZMQ endpoint"):
        plain.with_sync_overrides("localhost:7300")
    with pytest.raises(FleetConfigError, match=r"sync\.peers\[1\]: .*not a ZMQ endpoint"):
        plain.with_sync_overrides(peers=["tcp://h:1", "h:2"])


@pytest.mark.unit
def test_wire_round_trip_and_bad_payload() -> None:
    message = SyncMessage("a", "i", 1, "delta", 3, [WireEntry("r", "d", 3, False, 5, 2)])
    assert decode_message(encode_message(message)) == message
    sync = PeerSync(SyncSettings(), "b", lambda d, n: None, lambda r, p, n: None)
    sync.handle_payload(b"\x93garbage", 0.0)
    assert sync.stats.bad_messages == 1


# ---- two real coordinator apps over one simulated fleet -----------------------------------------


async def test_two_coordinator_apps_converge_over_one_fleet() -> None:
    """A launches the sims (decode in real time, so a request stays in flight); B is a second
    coordinator over the same engines (static endpoints, same replica ids). A request through A
    shows on B's `/admin/pools`; the client hanging up releases it on both."""

    from pdorch.app.server import run_coordinator
    from pdorch.config.fleet import parse_fleet_config
    from tests.coordinator.helpers import fleet, long_prompt, sim

    ea, eb = (f"tcp://127.0.0.1:{free_port()}" for _ in range(2))
    sync = {"peers": [ea, eb], "flush_interval_s": 0.02}
    config_a = fleet(decode=[sim(time_scale=1.0)], sync={**sync, "bind": ea})
    async with run_coordinator(config_a, port=0, origin="coord-a") as a:
        data = config_a.model_dump(mode="json", exclude_none=True)
        data["sync"] = {**sync, "bind": eb}
        for pool in ("prefill", "decode"):
            data["pools"][pool] = {
                "endpoints": [
                    {
                        "id": e.replica_id,
                        "url": e.url,
                        "kv_events_endpoint": e.kv_events_endpoint,
                        "kv_events_replay_endpoint": e.kv_events_replay_endpoint,
                        "kv_events_topic": e.kv_events_topic,
                    }
                    for e in a.fleet.by_pool(pool)
                ]
            }
        config_b = parse_fleet_config(data)
        async with run_coordinator(config_b, port=0, origin="coord-b") as b:
            # `Coordinator` starts its own PeerSync from the fleet file's `sync:` section.
            for running in (a, b):
                assert isinstance(running.coordinator.sync, PeerSync)
            async with http_client(timeout=30.0) as http:

                async def loads_of(url: str) -> dict[str, Any]:
                    view = (await http.get(f"{url}/admin/pools")).json()
                    return {
                        r["id"]: r["load"]
                        for pool in view["pools"].values()
                        for r in pool["replicas"]
                    }

                async def equal_and(predicate: Callable[[dict[str, Any]], bool]) -> bool:
                    la, lb = await loads_of(a.url), await loads_of(b.url)
                    return la == lb and predicate(la)

                body = {
                    "model": config_a.served_model_name,
                    "prompt": long_prompt(),
                    "max_tokens": 2000,
                    "stream": True,
                }
                async with http.stream("POST", f"{a.url}/v1/completions", json=body) as resp:
                    assert resp.status_code == 200
                    decode_id = resp.headers["x-pdorch-decode"]
                    assert resp.headers["x-pdorch-route"] == "pd"
                    # Keep the iterator referenced: a collected one closes the stream.
                    chunks = resp.aiter_bytes()
                    await anext(chunks)  # decoding on the decode engine now

                    def in_flight(view: dict[str, Any]) -> bool:
                        return bool(view[decode_id]["requests_in_flight"] == 1)

                    await async_wait_until(
                        lambda: equal_and(in_flight), 5.0, message="B's view == A's"
                    )
                # client gone: A aborts both legs, B hears the removal

                def idle(view: dict[str, Any]) -> bool:
                    return all(v["requests_in_flight"] == 0 for v in view.values())

                await async_wait_until(lambda: equal_and(idle), 5.0, message="released")

                # the sharing shows in /admin/pools and as Prometheus metrics
                async def sync_views() -> tuple[dict[str, Any], dict[str, Any]] | None:
                    views = [(await http.get(f"{u}/admin/pools")).json()["sync"] for u in urls]
                    # an idle B is heard from at its next heartbeat (heartbeat_interval_s)
                    heard = set(views[0]["peers"]) == {"coord-b"}
                    return (views[0], views[1]) if heard else None

                urls = (a.url, b.url)
                sync_a, sync_b = await async_wait_until(sync_views, 5.0, message="peers")
                assert sync_a["endpoint"] == ea and sync_b["endpoint"] == eb
                assert set(sync_b["peers"]) == {"coord-a"}
                assert sync_a["entries_sent"] >= 2 and sync_a["snapshots_sent"] >= 1
                assert sync_b["entries_applied"] >= 2  # A's admission and release
                assert sync_b["entries_received"] >= sync_b["entries_applied"]
                metrics = (await http.get(f"{b.url}/metrics")).text
                assert "pdorch_sync_peers 1.0" in metrics
                applied = re.search(r"^pdorch_sync_entries_applied_total (\S+)$", metrics, re.M)
                assert applied is not None and float(applied.group(1)) >= 2
                assert "pdorch_sync_peers_expired_total 0.0" in metrics


async def test_two_pdorch_serve_processes_converge(tmp_path: Path) -> None:
    """The deployment shape: engines and two `pdorch serve` in separate processes over one
    fleet file, each given its own `--sync-bind` and every coordinator as `--sync-peer`."""

    from benchmarks.proxy.processes import (
        RunningProcess,
        start_pdorch,
        start_sim,
        stop_process,
        write_pdorch_fleet,
    )

    started: list[RunningProcess] = []
    try:
        for role in ("prefill", "decode"):
            started.append(
                await start_sim(
                    role,
                    tmp_path,
                    time_scale=1.0,  # real time: a long decode stays in flight
                    model_profile="llama-3.1-8b",
                    served_model_name="m",
                    kv_events_port=free_port(),
                )
            )
        prefill, decode = started
        binds = [f"tcp://127.0.0.1:{free_port()}" for _ in range(2)]
        # one fleet file without `sync:`: the CLI creates the section for each process
        fleet_file = tmp_path / "fleet.yaml"
        write_pdorch_fleet(
            fleet_file, served_model_name="m", prefill=prefill, decode=decode, port=0
        )
        peers = [arg for bind in binds for arg in ("--sync-peer", bind)]
        urls = []
        for name, bind in zip("ab", binds, strict=True):
            (tmp_path / name).mkdir()
            coordinator = await start_pdorch(
                fleet_file, free_port(), tmp_path / name, serve_args=["--sync-bind", bind, *peers]
            )
            started.append(coordinator)
            urls.append(coordinator.url)

        async with http_client(timeout=30.0) as http:

            async def views() -> list[dict[str, int]]:
                out = []
                for url in urls:
                    view = (await http.get(f"{url}/admin/pools")).json()
                    out.append(
                        {
                            r["id"]: r["load"]["requests_in_flight"]
                            for pool in view["pools"].values()
                            for r in pool["replicas"]
                        }
                    )
                return out

            async def converged_on(expected: int) -> bool:
                va, vb = await views()
                return va == vb and va["decode-0"] == expected

            body = {"model": "m", "prompt": "x " * 600, "max_tokens": 1500, "stream": True}
            async with http.stream("POST", f"{urls[0]}/v1/completions", json=body) as resp:
                assert resp.headers["x-pdorch-route"] == "pd"
                chunks = resp.aiter_bytes()  # referenced: a collected iterator closes the stream
                await anext(chunks)
                await async_wait_until(lambda: converged_on(1), 5.0, message="B sees A's request")
            await async_wait_until(lambda: converged_on(0), 5.0, message="released on both")
    finally:
        for proc in reversed(started):
            stop_process(proc)
