"""The committed data (vLLM captures, public traces) is byte for byte what its `SHA256SUMS` lists.

A copy damaged in transit, converted line endings or a Git LFS pointer in place of the file
would otherwise surface as odd failures deep in the decoder or loader tests; here it fails in
milliseconds with the file's name. Every data file of a folder must be listed (README.md is
the folder's own prose and is not).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from tests.data import CHECKSUMMED_DIRS, REPO

_LINE = re.compile(r"(?P<digest>[0-9a-f]{64}) [ *](?P<name>[^/\s][^/]*)")
_LFS_POINTER = b"version https://git-lfs.github.com/spec/"
_UNLISTED = {"README.md", "SHA256SUMS"}


def parse_sha256sums(text: str) -> dict[str, str]:
    """`sha256sum` output (`<hex digest>  <name>` per line) as name -> digest; strict."""
    out: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        m = _LINE.fullmatch(line)
        if m is None:
            raise ValueError(f"line {n} is not '<sha256>  <name>': {line!r}")
        if m["name"] in out:
            raise ValueError(f"line {n}: {m['name']} listed twice")
        out[m["name"]] = m["digest"]
    return out


def test_parse_sha256sums_is_strict() -> None:
    digest = "ab" * 32
    assert parse_sha256sums(f"{digest}  a.bin\n{digest} *b c.txt\n") == {
        "a.bin": digest,
        "b c.txt": digest,
    }
    for bad in (f"{digest} a.bin", f"{digest[:-1]}  a.bin", f"{digest}  ../a.bin", "x"):
        with pytest.raises(ValueError):
            parse_sha256sums(bad)
    with pytest.raises(ValueError, match="twice"):
        parse_sha256sums(f"{digest}  a\n{digest}  a\n")


@pytest.mark.parametrize("folder", CHECKSUMMED_DIRS, ids=lambda p: str(p.relative_to(REPO)))
def test_committed_data_matches_sha256sums(folder: Path) -> None:
    sums = folder / "SHA256SUMS"
    assert sums.is_file(), f"{sums} missing: is the checkout complete?"
    listed = parse_sha256sums(sums.read_text(encoding="ascii"))
    present = {p.name for p in folder.iterdir() if p.is_file()} - _UNLISTED
    assert present == set(listed), f"{folder}: files and SHA256SUMS differ"
    for name, digest in sorted(listed.items()):
        data = (folder / name).read_bytes()
        assert not data.startswith(_LFS_POINTER), f"{folder / name} is a Git LFS pointer"
        assert hashlib.sha256(data).hexdigest() == digest, f"{folder / name}: sha256 mismatch"
