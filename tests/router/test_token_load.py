"""Token-load tracker: lifecycle, idempotence, never negative, reconciliation, deltas."""

from __future__ import annotations

import random

from router.token_load import TokenLoad, TokenLoadDelta

BS = 16


def admit(
    load: TokenLoad,
    rid: str,
    replica: str,
    now: float,
    prompt: int,
    uncached: int,
    decodes: bool = True,
) -> None:
    load.on_admitted(
        rid,
        replica,
        now,
        prompt_tokens=prompt,
        uncached_tokens=uncached,
        block_size=BS,
        decodes=decodes,
    )


def test_lifecycle_colocated() -> None:
    load = TokenLoad()
    admit(load, "r1", "a", 0.0, prompt=1000, uncached=600)
    assert load.load("a", 0.0).prefill_tokens_queued == 600
    assert load.load("a", 0.0).decode_blocks == 0
    assert load.load("a", 0.0).requests_in_flight == 1

    load.on_prefill_done("r1", "a", 1.0)
    snap = load.load("a", 1.0)
    assert snap.prefill_tokens_queued == 0
    assert snap.decode_blocks == 63  # ceil(1000 / 16)

    load.on_tokens("r1", "a", 2.0, generated_total=24)  # 1024 tokens of context
    assert load.load("a", 2.0).decode_blocks == 64
    load.on_tokens("r1", "a", 2.1, generated_total=25)
    assert load.load("a", 2.1).decode_blocks == 65

    load.on_finished("r1", 3.0)
    snap = load.load("a", 3.0)
    assert (snap.prefill_tokens_queued, snap.decode_blocks, snap.requests_in_flight) == (0, 0, 0)


def test_first_token_implies_prefill_done() -> None:
    load = TokenLoad()
    admit(load, "r1", "a", 0.0, prompt=32, uncached=32)
    load.on_tokens("r1", "a", 1.0, generated_total=1)
    snap = load.load("a", 1.0)
    assert snap.prefill_tokens_queued == 0
    assert snap.decode_blocks == 3  # ceil(33 / 16)


def test_prefill_only_leg_ends_at_prefill() -> None:
    load = TokenLoad()
    admit(load, "r1", "p", 0.0, prompt=4096, uncached=4096, decodes=False)
    admit(load, "r1", "d", 0.0, prompt=4096, uncached=0)
    assert load.load("p", 0.0).prefill_tokens_queued == 4096
    load.on_prefill_done("r1", "p", 1.0)
    assert load.load("p", 1.0).requests_in_flight == 0
    load.on_prefill_done("r1", "d", 1.1)
    assert load.load("d", 1.1).decode_blocks == 256
    load.on_finished("r1", 2.0)
    assert load.tracked_requests() == 0


def test_idempotent_events() -> None:
    load = TokenLoad()
    for _ in range(3):
        admit(load, "r1", "a", 0.0, prompt=100, uncached=100)
    assert load.load("a", 0.0).prefill_tokens_queued == 100
    assert load.load("a", 0.0).requests_in_flight == 1
    for _ in range(3):
        load.on_prefill_done("r1", "a", 1.0)
    assert load.load("a", 1.0).decode_blocks == 7
    load.on_tokens("r1", "a", 2.0, generated_total=40)
    load.on_tokens("r1", "a", 2.0, generated_total=40)
    load.on_tokens("r1", "a", 2.0, generated_total=10)  # late, reordered: ignored
    assert load.load("a", 2.0).decode_blocks == 9  # ceil(140 / 16)
    for _ in range(3):
        load.on_finished("r1", 3.0)
    load.on_tokens("r1", "a", 3.5, generated_total=50)  # after finish: ignored
    load.on_prefill_done("r1", "a", 3.5)
    snap = load.load("a", 3.5)
    assert (snap.prefill_tokens_queued, snap.decode_blocks, snap.requests_in_flight) == (0, 0, 0)


def test_abort_releases_everything() -> None:
    load = TokenLoad()
    admit(load, "r1", "p", 0.0, prompt=2048, uncached=2048, decodes=False)
    admit(load, "r1", "d", 0.0, prompt=2048, uncached=0)
    load.on_prefill_done("r1", "d", 0.5)
    admit(load, "r2", "d", 0.0, prompt=64, uncached=64)
    load.on_aborted("r1", 1.0)
    assert load.load("p", 1.0).prefill_tokens_queued == 0
    assert load.load("d", 1.0).decode_blocks == 0
    assert load.load("d", 1.0).prefill_tokens_queued == 64
    assert load.tracked_requests() == 1


def test_retry_after_abort_counts_again() -> None:
    load = TokenLoad()
    admit(load, "r1", "a", 0.0, prompt=64, uncached=64)
    load.on_aborted("r1", 1.0)
    admit(load, "r1", "a", 2.0, prompt=64, uncached=64)
    assert load.load("a", 2.0).prefill_tokens_queued == 64


def test_uncached_clamped_and_never_negative_under_random_events() -> None:
    load = TokenLoad()
    admit(load, "x", "a", 0.0, prompt=10, uncached=50)  # clamp to the prompt
    assert load.load("a", 0.0).prefill_tokens_queued == 10
    admit(load, "y", "a", 0.0, prompt=10, uncached=-5)
    assert load.load("a", 0.0).prefill_tokens_queued == 10

    rng = random.Random(7)
    load = TokenLoad()
    replicas = ["a", "b", "c"]
    for step in range(3000):
        rid = f"r{rng.randrange(40)}"
        rep = rng.choice(replicas)
        now = step * 0.01
        op = rng.randrange(6)
        if op == 0:
            admit(
                load,
                rid,
                rep,
                now,
                prompt=rng.randrange(1, 3000),
                uncached=rng.randrange(0, 3000),
                decodes=rng.random() < 0.7,
            )
        elif op == 1:
            load.on_prefill_done(rid, rep, now)
        elif op == 2:
            load.on_tokens(rid, rep, now, rng.randrange(0, 500))
        elif op == 3:
            load.on_finished(rid, now, rep if rng.random() < 0.5 else None)
        elif op == 4:
            load.on_aborted(rid, now)
        else:
            load.observe_metrics(
                rep,
                now,
                num_running=rng.randrange(0, 2),
                num_waiting=rng.randrange(0, 2),
                kv_usage=rng.random(),
                kv_capacity_blocks=1000,
            )
        for r in replicas:
            snap = load.load(r, now)
            assert snap.prefill_tokens_queued >= 0
            assert snap.decode_blocks >= 0
            assert snap.requests_in_flight >= 0
    for n in range(40):
        load.on_finished(f"r{n}", 100.0)
    for r in replicas:
        snap = load.load(r, 100.0)
        assert (snap.prefill_tokens_queued, snap.decode_blocks, snap.requests_in_flight) == (
            0,
            0,
            0,
        )


def test_idle_engine_drops_only_stale_entries() -> None:
    load = TokenLoad(stale_after_s=30.0)
    admit(load, "old", "a", 0.0, prompt=100, uncached=100)
    admit(load, "new", "a", 50.0, prompt=200, uncached=200)
    # Engine busy: nothing dropped whatever the age.
    assert load.observe_metrics("a", 60.0, num_running=1, num_waiting=0, kv_usage=0.1) == 0
    assert load.tracked_requests("a") == 2
    # Engine idle: the entry older than 30 s is a lost finish; the 10 s old one may be in flight.
    assert load.observe_metrics("a", 60.0, num_running=0, num_waiting=0, kv_usage=0.0) == 1
    assert load.tracked_requests("a") == 1
    assert load.load("a", 60.0).prefill_tokens_queued == 200


def test_kv_usage_bounds_decode_estimate_only_when_fresh() -> None:
    load = TokenLoad()
    admit(load, "r1", "a", 0.0, prompt=1600, uncached=1600)
    load.on_prefill_done("r1", "a", 1.0)
    assert load.load("a", 1.0).decode_blocks == 100
    # A scrape newer than the last change: the engine holds only 40 blocks in use.
    load.observe_metrics(
        "a", 2.0, num_running=1, num_waiting=0, kv_usage=0.04, kv_capacity_blocks=1000
    )
    snap = load.load("a", 2.0)
    assert snap.decode_blocks == 40
    assert snap.kv_capacity_blocks == 1000 and snap.num_running == 1
    # A tracked change after the scrape: the stale metric no longer bounds it.
    load.on_tokens("r1", "a", 3.0, generated_total=16)
    assert load.load("a", 3.0).decode_blocks == 101
    # Capacity is remembered when a later scrape omits it.
    load.observe_metrics("a", 4.0, num_running=1, num_waiting=0, kv_usage=0.5)
    assert load.load("a", 4.0).kv_capacity_blocks == 1000


def test_remove_replica() -> None:
    load = TokenLoad()
    admit(load, "r1", "a", 0.0, prompt=100, uncached=100)
    load.remove_replica("a", 1.0)
    assert load.load("a", 1.0).requests_in_flight == 0
    assert load.tracked_requests() == 0


def test_deltas_converge_between_coordinators() -> None:
    one, two = TokenLoad(origin="c1"), TokenLoad(origin="c2")
    admit(one, "r1", "a", 0.0, prompt=1000, uncached=1000)
    admit(two, "r2", "a", 0.0, prompt=320, uncached=320)
    for delta in one.export_deltas():
        two.apply_delta(delta, 0.1)
    for delta in two.export_deltas():
        one.apply_delta(delta, 0.1)
    assert one.load("a", 0.1).prefill_tokens_queued == 1320
    assert two.load("a", 0.1).prefill_tokens_queued == 1320

    one.on_prefill_done("r1", "a", 1.0)
    one.on_tokens("r1", "a", 1.5, generated_total=8)
    deltas = one.export_deltas()
    assert len(deltas) == 1  # coalesced: one absolute record per entry
    # Duplicated and replayed records change nothing.
    for delta in [*deltas, *deltas]:
        two.apply_delta(delta, 1.6)
    assert two.load("a", 1.6).decode_blocks == 63
    assert two.load("a", 1.6).prefill_tokens_queued == 320

    one.on_finished("r1", 2.0)
    removal = one.export_deltas()
    assert [d.removed for d in removal] == [True]
    two.apply_delta(removal[0], 2.1)
    two.apply_delta(deltas[0], 2.2)  # a late, older upsert does not resurrect it
    assert two.load("a", 2.2).decode_blocks == 0
    assert two.load("a", 2.2).requests_in_flight == 1  # r2 only

    # Own records echoed back are ignored; the wire form round-trips.
    assert not one.apply_delta(removal[0], 3.0)
    wire = removal[0].model_dump_json()
    assert TokenLoadDelta.model_validate_json(wire) == removal[0]


def test_out_of_order_deltas_keep_highest_version() -> None:
    one, two = TokenLoad(origin="c1"), TokenLoad(origin="c2")
    admit(one, "r1", "a", 0.0, prompt=160, uncached=160)
    first = one.export_deltas()
    one.on_prefill_done("r1", "a", 1.0)
    second = one.export_deltas()
    two.apply_delta(second[0], 1.0)
    two.apply_delta(first[0], 1.0)
    snap = two.load("a", 1.0)
    assert (snap.prefill_tokens_queued, snap.decode_blocks) == (0, 10)


def test_remote_entry_changes_only_through_its_owner() -> None:
    one, two = TokenLoad(origin="c1"), TokenLoad(origin="c2")
    admit(one, "r1", "a", 0.0, prompt=160, uncached=160)
    for delta in one.export_deltas():
        two.apply_delta(delta, 0.0)
    two.on_prefill_done("r1", "a", 1.0)
    two.on_tokens("r1", "a", 1.0, generated_total=1000)
    snap = two.load("a", 1.0)
    assert (snap.prefill_tokens_queued, snap.decode_blocks) == (160, 0)
    assert two.export_deltas() == []  # nothing of its own to share


def test_a_scrape_never_erases_a_decode_reservation() -> None:
    """A P/D decode leg not sent yet is in no engine: its reserved blocks survive a fresh scrape
    that shows an idle-ish engine; once sent, the engine's KV usage bounds them again."""
    load = TokenLoad()
    load.on_reserved("r1", "d", 1.0, prompt_tokens=1600, block_size=16)  # 100 blocks
    load.on_admitted("r0", "d", 1.0, prompt_tokens=160, uncached_tokens=0, block_size=16)
    load.on_prefill_done("r0", "d", 1.0)  # 10 blocks the engine holds
    load.observe_metrics("d", 2.0, num_running=1, num_waiting=0, kv_usage=0.01,
                         kv_capacity_blocks=500)  # fmt: skip
    # the held 10 are bounded by ceil(0.01 * 500) = 5; the 100 reserved stay
    assert load.load("d", 2.0).decode_blocks == 5 + 100
    load.on_leg_sent("r1", "d", 3.0)
    load.observe_metrics("d", 4.0, num_running=2, num_waiting=0, kv_usage=0.1,
                         kv_capacity_blocks=500)  # fmt: skip
    assert load.load("d", 4.0).decode_blocks == 50  # min(110, ceil(0.1 * 500))
    assert load.tracked_load("d").decode_blocks == 110


def test_reservation_travels_in_deltas() -> None:
    a, b = TokenLoad(origin="a"), TokenLoad(origin="b")
    a.on_reserved("r", "d", 1.0, prompt_tokens=320, block_size=16)
    for delta in a.export_deltas():
        assert delta.reserved
        b.apply_delta(delta, 1.0)
    b.observe_metrics("d", 2.0, num_running=0, num_waiting=1, kv_usage=0.0,
                      kv_capacity_blocks=100)  # fmt: skip
    assert b.load("d", 2.0).decode_blocks == 20
    a.on_leg_sent("r", "d", 3.0)
    for delta in a.export_deltas():
        assert not delta.reserved
        b.apply_delta(delta, 3.0)
    b.observe_metrics("d", 4.0, num_running=1, num_waiting=0, kv_usage=0.0,
                      kv_capacity_blocks=100)  # fmt: skip
    assert b.load("d", 4.0).decode_blocks == 0
