"""One process: ResNet-18 CIFAR batch-1 inference with the defaults, through the bench's
runner; prints the median and 10th/90th percentiles of N back-to-back steps (ms).

    python benchmarks/results/batch1_process_variance_zen3_cpu/aslr/b1proc.py LABEL [N]

Run from the repository root (it imports ``benchmarks/interleaved_steps.py``).
"""

import sys
import time

import numpy as np

sys.path.insert(0, "benchmarks")
from interleaved_steps import bench_options, runner, workload  # noqa: E402

w = workload("resnet18", "infer", 1)
r = runner(w, "table", bench_options(w))
r.setup()
for _ in range(20):
    r.step()
ts = []
for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 400):
    t = time.perf_counter()
    r.step()
    ts.append(time.perf_counter() - t)
ms = np.array(ts) * 1e3
p10, p90 = np.percentile(ms, 10), np.percentile(ms, 90)
print(sys.argv[1], f"median {np.median(ms):.2f} p10 {p10:.2f} p90 {p90:.2f}", flush=True)
