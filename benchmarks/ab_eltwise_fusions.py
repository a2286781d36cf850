"""A training step with and without YNNPACK's elementwise fusions, interleaved round by round.

``current`` is compiled with ``interleaved_steps.bench_options`` (the fast options for the
model, batch and SGD with momentum as beside PyTorch, without the precision: YNNPACK's
elementwise fusions in, as before ``fast_defaults``' oneDNN rule), ``dot+reduce`` the same
without ``LIBRARY_FUSION_TYPE_ELTWISE`` (what that rule gives) and ``dot`` without ``REDUCE``
either. NHWC, the shipped conv table (``auto``), ``precision`` as given. The last
column is the per-round ratio current / variant (above 1: the variant is faster), median and
its 20-80% range.

    python benchmarks/ab_eltwise_fusions.py resnet50 16 mixed_bf16 8
"""

import statistics
import sys

from interleaved_steps import bench_options, runner, workload

KEY = "xla_cpu_experimental_ynn_fusion_type"
Y = "LIBRARY_FUSION_TYPE_"


def main(model: str, batch: int, precision: str, rounds: int) -> None:
    w = workload(model, "train", batch)
    base = bench_options(w, precision=precision)
    variants = {
        "current": base,
        "dot+reduce": {**base, KEY: f"{Y}INDIVIDUAL_DOT,{Y}REDUCE"},
        "dot": {**base, KEY: f"{Y}INDIVIDUAL_DOT"},
    }
    print(model, batch, precision, "bench options:", base)
    runners = {k: runner(w, k, v, precision=precision) for k, v in variants.items()}
    for r in runners.values():
        r.setup()
        r.step()
        r.step()
    times = {k: [] for k in runners}
    for _ in range(rounds):
        for k, r in runners.items():
            times[k].append(_timed(r))
    ref = times["current"]
    for k, ts in times.items():
        ratios = sorted(a / b for a, b in zip(ref, ts, strict=True))
        lo, hi = ratios[len(ratios) // 5], ratios[4 * len(ratios) // 5]
        print(
            f"{k:12s} median {statistics.median(ts):8.1f} ms  min {min(ts):8.1f}  "
            f"current/{k} {statistics.median(ratios):.3f} [{lo:.3f}, {hi:.3f}]"
        )


def _timed(r) -> float:
    import time

    t = time.perf_counter()
    r.step()
    return (time.perf_counter() - t) * 1e3


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
