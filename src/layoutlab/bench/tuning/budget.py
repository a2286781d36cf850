"""Does autotuning a run's convs pay? Its estimated cost against a share of the run.

Tuning a conv shape compiles every candidate (forward and training programs), checks each
against float64 NumPy references and times them over ``repeats + warmup`` interleaved
rounds. ``estimate_tuning`` prices that from one calibration, the ``xla`` candidate of the
run's largest shape (compile time, time per round) and a float64 matmul (the references),
scaled by each shape's FLOPs; the run is priced as ``steps x`` the FLOPs of its convs at the
same rate, a lower bound of its time (everything else a step does is left out), so the
estimate errs towards not tuning. Before calibrating, ``cannot_pay`` rules out runs that
are too short even at an optimistic rate and compile time, so a short run (the built-in
digits job) pays nothing for the question.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from layoutlab.nn.conv_algos import ConvSpec

__all__ = ["TUNE_SHARE", "TuningEstimate", "cannot_pay", "conv_flops", "estimate_tuning"]

TUNE_SHARE = 0.10  # tune when the estimate is at most this share of the run
# Optimistic bounds for ``cannot_pay``: faster than any measured conv step on that backend,
# and a compile cheaper than any measured candidate compile (about 0.1-1 s on CPU).
_FAST_RATE = {"cpu": 2e12, "gpu": 2e15}
_FAST_COMPILE_S = 0.02


class TuningEstimate(NamedTuple):
    tune_s: float  # estimated seconds to tune every shape
    run_s: float  # lower bound of the run's seconds
    pays: bool  # tune_s <= TUNE_SHARE * run_s

    def describe(self) -> str:
        share = self.tune_s / self.run_s if self.run_s else math.inf
        return (
            f"tuning ~{self.tune_s:.0f} s against a run of at least {self.run_s:.0f} s "
            f"({share:.0%}; it pays at <= {TUNE_SHARE:.0%})"
        )


def conv_flops(spec: ConvSpec, objective: str = "train") -> float:
    """Multiply-adds x 2 of the conv's forward; x 3 with both gradients (``"train"``)."""
    g = spec.geometry
    ho, wo = spec.out_size
    fwd = 2.0 * spec.batch * ho * wo * spec.out_features * spec.in_features / g.groups
    fwd *= g.kernel_size[0] * g.kernel_size[1]
    return 3 * fwd if objective == "train" else fwd


def _distinct(specs: Mapping[str, ConvSpec]) -> list[ConvSpec]:
    return list({s.key(): s for s in specs.values()}.values())


def _tune_cost(shapes, n_candidates, rate, compile_s, ref_rate, rounds) -> float:
    total = 0.0
    for spec in shapes:
        train, fwd = conv_flops(spec), conv_flops(spec, "inference")
        n = n_candidates(spec)
        total += n * (2 * compile_s + rounds * (train + fwd) / rate) + train / ref_rate
    return total


def cannot_pay(
    specs: Mapping[str, ConvSpec], steps: int, backend: str, n_candidates, rounds: int
) -> bool:
    """True when tuning costs more than ``TUNE_SHARE`` of the run even at an optimistic
    conv rate and compile time (no measurement)."""
    rate = _FAST_RATE.get(backend, _FAST_RATE["cpu"])
    run_s = steps * sum(conv_flops(s) for s in specs.values()) / rate
    tune_s = _tune_cost(_distinct(specs), n_candidates, rate, _FAST_COMPILE_S, math.inf, rounds)
    return tune_s > TUNE_SHARE * run_s


def _float64_rate() -> float:
    """FLOP/s of a float64 NumPy matmul here (the references' speed)."""
    a = np.ones((384, 384))
    a @ a
    t0 = time.perf_counter()
    a @ a
    return 2 * 384**3 / max(time.perf_counter() - t0, 1e-6)


def estimate_tuning(
    specs: Mapping[str, ConvSpec],
    steps: int,
    *,
    n_candidates,
    rounds: int,
    device=None,
    compiler_options: dict | None = None,
) -> TuningEstimate:
    """Calibrated estimate for tuning the convs ``specs`` (``{path: spec}``: every conv of
    one step) of a run of ``steps`` passes; see the module doc."""
    from layoutlab.bench.tuning.conv_candidates import candidate_fns, time_candidate_rounds
    from layoutlab.bench.tuning.conv_reference import spec_inputs

    shapes = _distinct(specs)
    big = max(shapes, key=conv_flops)
    t0 = time.perf_counter()
    candidate_fns(big, "xla", device, compiler_options)
    compile_s = (time.perf_counter() - t0) / 2  # forward and training programs
    timed = time_candidate_rounds(
        big, ["xla"], spec_inputs(big, 0), repeats=2, warmup=1, device=device,
        compiler_options=compiler_options,
    )  # fmt: skip
    train_s = min(timed[("train", "xla")]) / 1e3
    rate = conv_flops(big) / max(train_s, 1e-9)
    run_s = steps * sum(conv_flops(s) for s in specs.values()) / rate
    tune_s = _tune_cost(shapes, n_candidates, rate, compile_s, _float64_rate(), rounds)
    return TuningEstimate(tune_s, run_s, tune_s <= TUNE_SHARE * run_s)
