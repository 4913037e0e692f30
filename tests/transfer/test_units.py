"""Pure parts of transfer/: lease table (clock passed in), address schema, pool checks."""

from __future__ import annotations

import pydantic
import pytest

from transfer import BadBlockIds, KvBlockPool, KvTransferParams, LeaseTable, PeerAddress


def test_lease_table_expires_in_order_and_extends() -> None:
    table = LeaseTable()
    table.hold("a", [1, 2], expires_at=10.0)
    table.hold("b", [3], expires_at=5.0)
    assert table.next_expiry() == 5.0
    assert table.blocks_held == 3
    assert table.pop_expired(4.9) == []
    assert [lease.request_id for lease in table.pop_expired(5.0)] == ["b"]
    assert table.extend("a", 20.0) is not None
    extended = table.extend("a", 15.0)
    assert extended is not None and extended.expires_at == 20.0  # never shortens
    assert table.pop_expired(10.0) == []  # the stale heap entry is skipped
    assert table.next_expiry() == 20.0
    assert table.extend("missing", 30.0) is None


def test_lease_table_release_and_duplicates() -> None:
    table = LeaseTable()
    table.hold("a", [1], expires_at=1.0)
    with pytest.raises(ValueError, match="already holds"):
        table.hold("a", [2], expires_at=2.0)
    lease = table.release("a")
    assert lease is not None and lease.block_ids == (1,)
    assert table.release("a") is None
    assert table.pop_expired(100.0) == []
    assert table.next_expiry() is None
    assert len(table) == 0


def test_peer_address_round_trips_through_kv_transfer_params() -> None:
    peer = PeerAddress(engine_id="e1", host="10.0.0.7", port=18600)
    params = peer.kv_transfer_params([4, 5, 9], "req-1", remote_num_tokens=40, new_key="v")
    assert params.remote_block_ids == [[4, 5, 9]]
    assert params.do_remote_prefill is True
    assert params.remote_num_tokens == 40
    assert params.unknown == {"new_key": "v"}
    assert params.peer() == peer
    parsed = KvTransferParams.parse(params.wire())
    assert parsed == params
    assert parsed.block_ids() == [4, 5, 9]
    assert KvTransferParams(remote_block_ids=[1, 2]).block_ids() == [1, 2]
    assert KvTransferParams(remote_block_ids=[[7, 8], [9]]).first_group() == [7, 8]
    assert KvTransferParams().first_group() == []


# vLLM 0.32's NixlConnector answer to a prefill leg (RUNTIME-FACTS "Protocol"), plus a key a
# newer vLLM might add
VLLM_ANSWER = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_block_ids": [[1, 2, 3]],
    "remote_engine_id": "0e5b3c2a",
    "remote_request_id": "cmpl-1-0",
    "remote_host": "127.0.0.1",
    "remote_port": 18600,
    "tp_size": 1,
    "dcp_size": 1,
    "pp_size": 1,
    "remote_num_tokens": 494,
    "remote_blocks_expiry_time": None,
    "transfer_mode": "pull",
    "remote_prefill_cached_tokens": 32,
    "from_the_future": {"nested": [1]},
}


def test_kv_transfer_params_send_back_exactly_what_came_in() -> None:
    params = KvTransferParams.parse(VLLM_ANSWER)
    assert params.remote_num_tokens == 494 and params.transfer_mode == "pull"
    assert params.unknown == {"from_the_future": {"nested": [1]}}
    wire = params.wire()
    assert wire == VLLM_ANSWER
    wire["from_the_future"]["nested"].append(2)  # the caller's copy, not the params'
    assert params.wire() == VLLM_ANSWER
    # defaults are never invented: vLLM reads `get("dcp_size", 1)`, a null would not default
    assert KvTransferParams.parse({"do_remote_decode": True}).wire() == {"do_remote_decode": True}
    moved = params.replace(remote_block_ids=[[4]])
    assert moved.wire() == {**VLLM_ANSWER, "remote_block_ids": [[4]]}
    with pytest.raises(pydantic.ValidationError):
        # frozen, so a retry resends the same params; mypy knows it too (the assignment is the
        # test)
        params.remote_port = 1  # type: ignore[misc]


def test_kv_transfer_params_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match="remote_host"):
        KvTransferParams(remote_engine_id="e", remote_port=1).peer()
    with pytest.raises(ValueError, match="remote_port"):
        KvTransferParams.parse({"remote_port": "not-a-port"})
    with pytest.raises(ValueError, match="must be an object"):
        KvTransferParams.parse([1])
    with pytest.raises(ValueError, match="2 KV-cache groups"):
        KvTransferParams(remote_block_ids=[[1], [2]]).block_ids()


def test_pool_layout_and_id_checks() -> None:
    pool = KvBlockPool(4, 4096)
    assert pool.nbytes == 4 * 4096
    assert pool.block_address(3) == pool.base_address + 3 * 4096
    rows = pool.descriptors()
    assert rows.shape == (4, 3) and int(rows[2, 0]) == pool.block_address(2)
    pool.block(1)[:] = 7
    assert int(pool.blocks_array()[1].sum()) == 7 * 4096
    with pytest.raises(BadBlockIds, match="out of range"):
        pool.check_ids([4])
    with pytest.raises(BadBlockIds, match="appears twice"):
        pool.check_ids([1, 1])
    with pytest.raises(BadBlockIds, match="not an int"):
        pool.check_ids([True])
    with pytest.raises(ValueError):
        KvBlockPool(0, 16)
