"""A KV pool: one contiguous region of fixed-size blocks, registered once with a mover.

One region (not one allocation per block) because NIXL/UCX registration is expensive (pinning,
rkeys, shm mapping) and a peer then needs one base address plus the layout to address any block:
block `i` lives at `base_address + i * block_bytes`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from transfer.errors import BadBlockIds

Uint8Array = npt.NDArray[np.uint8]


class KvBlockPool:
    """`num_blocks` blocks of `block_bytes` each, on the host (numpy) or in a torch tensor.

    With `tensor=None` the pool allocates host memory and, with `touch=True` (default), writes
    every page once: the first READ into never-touched pages was measured 10x slower (page faults
    inside the copy), and `np.zeros` would only map the shared zero page lazily. With a torch
    tensor (host or CUDA; any dtype, must be contiguous and exactly num_blocks x block_bytes
    bytes) the pool wraps it without copying; `block(i)` then needs a host tensor.
    """

    def __init__(
        self,
        num_blocks: int,
        block_bytes: int,
        *,
        tensor: Any | None = None,
        touch: bool = True,
    ) -> None:
        if num_blocks <= 0 or block_bytes <= 0:
            raise ValueError(
                f"num_blocks and block_bytes must be > 0, got {num_blocks}, {block_bytes}"
            )
        self.num_blocks = num_blocks
        self.block_bytes = block_bytes
        self.nbytes = num_blocks * block_bytes
        self.tensor = tensor
        self._array: Uint8Array | None
        if tensor is None:
            array = np.empty((num_blocks, block_bytes), dtype=np.uint8)
            if touch:
                array.fill(0)
            self._array = array
            self.base_address = int(array.ctypes.data)
            self.mem_type = "DRAM"
            self.device_id = 0
        else:
            if not tensor.is_contiguous():
                raise ValueError("tensor must be contiguous")
            size = int(tensor.numel()) * int(tensor.element_size())
            if size != self.nbytes:
                raise ValueError(
                    f"tensor has {size} bytes, pool needs num_blocks*block_bytes = {self.nbytes}"
                )
            self.base_address = int(tensor.data_ptr())
            if tensor.is_cuda:
                self.mem_type = "VRAM"
                self.device_id = int(tensor.get_device())
                self._array = None
            else:
                self.mem_type = "DRAM"
                self.device_id = 0
                import torch

                # A caller's tensor is its own memory, already in use: it is not touched here.
                flat = tensor.reshape(-1).view(torch.uint8)
                self._array = flat.numpy().reshape(num_blocks, block_bytes)

    @property
    def is_host(self) -> bool:
        return self._array is not None

    def blocks_array(self) -> Uint8Array:
        """The whole pool as a (num_blocks, block_bytes) uint8 view (host pools only)."""
        if self._array is None:
            raise TypeError("pool is in device memory: use .tensor")
        return self._array

    def block(self, i: int) -> Uint8Array:
        """A uint8 view of block `i` (host pools only)."""
        self.check_ids([i], "block id")
        block: Uint8Array = self.blocks_array()[i]
        return block

    def block_address(self, i: int) -> int:
        return self.base_address + i * self.block_bytes

    def check_ids(self, ids: Sequence[int], what: str = "block ids") -> list[int]:
        """Return `ids` as ints, or raise BadBlockIds naming the first bad one."""
        out: list[int] = []
        seen: set[int] = set()
        for pos, raw in enumerate(ids):
            if isinstance(raw, bool) or not isinstance(raw, int | np.integer):
                raise BadBlockIds(f"{what}[{pos}] = {raw!r} is not an int")
            i = int(raw)
            if not 0 <= i < self.num_blocks:
                raise BadBlockIds(
                    f"{what}[{pos}] = {i} is out of range for a pool of {self.num_blocks} blocks"
                )
            if i in seen:
                raise BadBlockIds(f"{what}[{pos}] = {i} appears twice")
            seen.add(i)
            out.append(i)
        return out

    def descriptors(self) -> npt.NDArray[np.uint64]:
        """One (address, length, device id) row per block, the NIXL descriptor layout."""
        rows = np.empty((self.num_blocks, 3), dtype=np.uint64)
        rows[:, 0] = self.base_address + np.arange(self.num_blocks, dtype=np.uint64) * np.uint64(
            self.block_bytes
        )
        rows[:, 1] = self.block_bytes
        rows[:, 2] = self.device_id
        return rows
