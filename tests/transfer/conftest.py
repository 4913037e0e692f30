"""Fixtures for the mover tests: owners in their own processes, a puller in the test's loop."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Protocol

import pytest

from tests.transfer.owner_process import OwnerProcess
from transfer import BlockMover, KvBlockPool, KvTransport, UcxTransport, make_block_mover

BLOCK_BYTES = 64 * 1024
OWNER_BLOCKS = 64
PULLER_BLOCKS = 48
SEED = 1234

# NIXL is part of `make install`: if it cannot be imported the NIXL cases fail (they are not
# skipped), so a broken install never passes as a green run.
KINDS = [KvTransport.NIXL, KvTransport.TCP]


@pytest.fixture(scope="module", params=KINDS, ids=str)
def kind(request: pytest.FixtureRequest) -> KvTransport:
    return KvTransport(request.param)


class StartOwner(Protocol):
    """The `start_owner` fixture: an owner process of the test's kind, `OwnerProcess`'s options."""

    def __call__(
        self,
        seed: int = SEED,
        num_blocks: int = OWNER_BLOCKS,
        block_bytes: int = BLOCK_BYTES,
        *,
        transport: UcxTransport = UcxTransport.AUTO,
        wait: bool = True,
    ) -> OwnerProcess: ...


@pytest.fixture
def start_owner(kind: KvTransport) -> Iterator[StartOwner]:
    """Start owners of `kind` (each a real process); all are stopped at teardown."""
    owners: list[OwnerProcess] = []

    def start(
        seed: int = SEED,
        num_blocks: int = OWNER_BLOCKS,
        block_bytes: int = BLOCK_BYTES,
        *,
        transport: UcxTransport = UcxTransport.AUTO,
        wait: bool = True,
    ) -> OwnerProcess:
        owner = OwnerProcess(kind, num_blocks, block_bytes, seed, transport=transport, wait=wait)
        owners.append(owner)
        return owner

    yield start
    for owner in owners:
        owner.close()


@pytest.fixture(scope="module")
def shared_owner(kind: KvTransport) -> Iterator[OwnerProcess]:
    """One owner per kind for the tests that neither kill nor stop it (unique request ids)."""
    owner = OwnerProcess(kind, OWNER_BLOCKS, BLOCK_BYTES, SEED)
    try:
        yield owner
    finally:
        owner.close()


@pytest.fixture
async def puller(kind: KvTransport) -> AsyncIterator[BlockMover]:
    mover = make_block_mover(KvBlockPool(PULLER_BLOCKS, BLOCK_BYTES), kind)
    await mover.start()
    try:
        yield mover
    finally:
        await mover.close()
