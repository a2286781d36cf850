"""``benchmarks/kill_resume_attack.py`` in its smallest sweep, so that the script cannot rot:
two kill -9s of one one-process run through the command line, each followed by ``--resume``,
and the run ends bit for bit where its uninterrupted run ends (the script's own comparison:
every array of the newest checkpoint, every ``metrics.jsonl`` and ``steps.jsonl`` row).
Where a kill lands depends on the machine's speed, so only the totals that do not are checked.
"""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "kill_resume_attack.py"
COLUMNS = ("attempted", "landed", "save", "train", "resume", "missed", "runs", "lost", "unequal")


def test_smallest_sweep_kills_resumes_and_ends_bitwise(tmp_path):
    out = tmp_path / "attack.md"
    argv = ["--kills", "2", "--quick", "--configs", "1p-keep1", "--out", str(out)]
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "elapsed:" in proc.stdout
    row = next(x for x in out.read_text().splitlines() if x.startswith("| 1p-keep1 |"))
    got = dict(zip(COLUMNS, map(int, row.strip("| ").split(" | ")[1:]), strict=True))
    assert got["attempted"] == 2 and got["runs"] == 1, got
    # A kill lands (during a save, training or a resume) unless the run ended first.
    assert got["landed"] + got["missed"] == 2, got
    assert got["save"] + got["train"] + got["resume"] == got["landed"], got
    assert got["lost"] == got["unequal"] == 0, got
