"""Fleet shapes: `4P4D` (4 prefill + 4 decode replicas), `8C` (8 colocated), `2P4D2C`."""

from __future__ import annotations

import re
from dataclasses import dataclass

_PART = re.compile(r"(\d+)([PDC])", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class FleetSpec:
    """Replica counts per pool. Replica ids: `p0..`, `d0..`, `c0..`."""

    prefill: int = 0
    decode: int = 0
    colocated: int = 0

    @classmethod
    def parse(cls, text: str) -> FleetSpec:
        """`"4P4D"`, `"8C"`, `"2P4D2C"` (case-insensitive, any order). ValueError names the
        problem: a P pool needs a D pool (prefill-only replicas cannot decode)."""
        s = text.strip()
        pos = 0
        counts = {"P": 0, "D": 0, "C": 0}
        for m in _PART.finditer(s):
            if m.start() != pos:
                break
            counts[m.group(2).upper()] += int(m.group(1))
            pos = m.end()
        if pos != len(s) or not s:
            raise ValueError(f"fleet: {text!r} is not like 4P4D, 8C or 2P4D2C")
        spec = cls(counts["P"], counts["D"], counts["C"])
        if spec.total == 0:
            raise ValueError(f"fleet: {text!r} has no replicas")
        if spec.prefill and not spec.decode:
            raise ValueError(f"fleet: {text!r} has prefill replicas but no decode pool")
        return spec

    @property
    def total(self) -> int:
        return self.prefill + self.decode + self.colocated

    def replica_ids(self) -> list[tuple[str, str]]:
        """(replica id, role) in a fixed order: prefill, decode, colocated."""
        out = [(f"p{i}", "prefill") for i in range(self.prefill)]
        out += [(f"d{i}", "decode") for i in range(self.decode)]
        out += [(f"c{i}", "colocated") for i in range(self.colocated)]
        return out

    def __str__(self) -> str:
        parts = []
        for n, tag in ((self.prefill, "P"), (self.decode, "D"), (self.colocated, "C")):
            if n:
                parts.append(f"{n}{tag}")
        return "".join(parts)
