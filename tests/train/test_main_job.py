"""The README's main job: ``layoutlab train`` with no arguments, as a new user runs it.

docs/guides/training.md states its result: 99.16% test accuracy on digits (356 of the 359
test images). The run is a subprocess on JAX's one CPU device, as on a user's machine (the
suite's other training subprocesses get conftest's four fake devices).
"""

import json
import subprocess
import sys

TEST_IMAGES = 359  # digits' test split: 20% of 1,797 images, drawn with seed 0
DOCUMENTED_CORRECT = 356  # 99.16%


def test_main_job_reaches_the_documented_accuracy(tmp_path, env):
    flags = " ".join(
        f for f in env.get("XLA_FLAGS", "").split() if "host_platform_device_count" not in f
    )
    workdir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "layoutlab.cli", "train", "--workdir", str(workdir), "--quiet"],
        capture_output=True,
        text=True,
        env={**env, "XLA_FLAGS": flags},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    last = json.loads((workdir / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["epoch"] == 5.0 and last["step"] == 220
    correct = round(last["test_accuracy"] * TEST_IMAGES)
    assert abs(last["test_accuracy"] - correct / TEST_IMAGES) < 1e-9
    # One image either way: the same seed gives the same numbers on one CPU, but float32
    # sums run in a different order on AVX2 and AVX-512 machines, and an image near the
    # decision boundary may change class. The documented 356 was reached on both kinds.
    assert abs(correct - DOCUMENTED_CORRECT) <= 1, last
