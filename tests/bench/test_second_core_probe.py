"""``benchmarks/second_core_probe.py`` end to end on a tiny conv: one child process per core
count, every row timed in both."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

_SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "second_core_probe.py"


def test_probe_times_every_row_on_one_core_and_on_all():
    out = subprocess.run(
        [sys.executable, str(_SCRIPT), "--size", "8", "--channels", "8", "--repeats", "3"],
        check=True, capture_output=True, text=True, timeout=300,
    ).stdout  # fmt: skip
    rows = {}
    for line in out.splitlines()[2:]:
        m = re.match(r"(.+?)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)x$", line)
        assert m, line
        # Times only: beside the other tests' processes a tiny conv's speed-up means little.
        one, many = (float(v) for v in m.groups()[1:3])
        assert one > 0 and many > 0
        rows[m.group(1).strip()] = (one, many)
    want = {"xla conv", "ynnpack conv", "xla 2 independent convs", "xla 4 independent convs",
            "xla batch 8"}  # fmt: skip
    assert want <= set(rows)
