"""`tune_gc_for_serving`: the start-up heap is frozen and young collections are rarer.

Run in a fresh interpreter: the settings are process-wide and must not leak into the tests.
"""

from __future__ import annotations

import json
import subprocess
import sys

from pdorch.app.gc_tuning import GEN0_THRESHOLD, GEN1_THRESHOLD, GEN2_THRESHOLD

_PROBE = """
import gc, json
from pdorch.app.gc_tuning import tune_gc_for_serving
before = [gc.get_freeze_count(), list(gc.get_threshold())]
tune_gc_for_serving()
print(json.dumps({"before": before, "after": [gc.get_freeze_count(), list(gc.get_threshold())]}))
"""


def test_freezes_the_heap_and_raises_the_thresholds() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=60, check=True
    )
    seen = json.loads(out.stdout)
    assert seen["before"] == [0, [700, 10, 10]]  # CPython's defaults
    frozen, thresholds = seen["after"]
    assert frozen > 1000  # the interpreter's and pdorch's objects at the time of the call
    assert thresholds == [GEN0_THRESHOLD, GEN1_THRESHOLD, GEN2_THRESHOLD]
