"""The flops of the convs a program runs as oneDNN calls, which XLA's cost analysis cannot see.

XLA's ``cost_analysis()`` knows nothing of a custom call's work: jax 0.10's XLA:CPU counts
each one as -1 flop, so a training step whose convs run as ``layoutlab_onednn_*`` calls
reported almost no flops and bench's GFLOP/s column read 0.3-1.5 for it. A conv call's work
follows from its shapes alone (every call takes and returns NHWC or NCHW activations and an
HWIO kernel): ``2 * out_pixels * out_channels * kh * kw * in_channels / groups`` multiply-adds
counted as two flops each, padding taps included (the per-conv table's count; XLA's own
conv count skips the taps that land in padding, a few percent fewer on small images).
"""

from __future__ import annotations

import math

from layoutlab.xla.hlo_extract import onednn_kind
from layoutlab.xla.hlo_ops import CustomCallOp

__all__ = ["XLA_FLOPS_PER_CUSTOM_CALL", "onednn_conv_flops", "onednn_flops_in"]

# What XLA's cost analysis adds for one custom call
# (checked by tests/xla/test_xla_onednn_report.py).
XLA_FLOPS_PER_CUSTOM_CALL = -1.0


def onednn_conv_flops(call: CustomCallOp) -> float | None:
    """The flops of one oneDNN conv call (forward, input or weight gradient); None for a
    custom call that is not one."""
    kind = onednn_kind(call.target)
    if len(call.operands) != 2 or isinstance(call.result, tuple):
        return None
    if kind == "forward":
        out, kernel = call.result, call.operands[1]
    elif kind == "backward data":
        out, kernel = call.operands[0], call.operands[1]
    elif kind == "backward weights":
        out, kernel = call.operands[1], call.result
    else:
        return None
    # HWIO: every kernel element but the out-channel axis is summed per output element. A
    # packed kernel (nn.conv_algos.onednn_packed) is bytes shaped (kh, kw, in, out, bytes).
    hwi = kernel.dims[:3]
    return 2.0 * math.prod(out.dims) * math.prod(hwi)


def onednn_flops_in(custom_calls) -> tuple[float, int]:
    """``(flops, calls)`` of the oneDNN conv calls among ``custom_calls``."""
    counted = [f for f in map(onednn_conv_flops, custom_calls) if f is not None]
    return float(sum(counted)), len(counted)
