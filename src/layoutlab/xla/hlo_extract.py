"""From parsed HLO instructions to op records.

- ``decode_dim_labels`` reads a conv's ``dim_labels`` into a *logical* order per operand (the
  axes as the op sees them, e.g. ``NCHW``/``OIHW``) and ``physical_order`` reorders it from
  slowest to fastest in memory, read from the ``{minor_to_major}`` layouts (e.g. ``NHWC``);
- ``classify_computations`` tells fusion bodies from the entry, control-flow bodies and
  scalar ``to_apply`` lambdas, and which fusion instruction runs each;
- ``op_records`` builds the records one instruction adds to a report.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from layoutlab.xla.hlo_ops import ConvOp, CustomCallOp, DataMoveOp, DotOp, Window
from layoutlab.xla.hlo_parse import (
    ArrayShape,
    HloModule,
    Instruction,
    first_array,
    shape_bytes,
)

__all__ = [
    "ONEDNN_CONV_KINDS",
    "ONEDNN_PREFIX",
    "classify_computations",
    "decode_dim_labels",
    "fusion_kind",
    "onednn_kind",
    "op_records",
    "parse_window",
    "physical_order",
]

_SPATIAL_LETTERS = {1: "W", 2: "HW", 3: "DHW"}
_ACTIVATION_LETTERS = {"b": "N", "f": "C"}
_KERNEL_LETTERS = {"o": "O", "i": "I"}
_CALL_ATTRS = (
    "calls",
    "to_apply",
    "body",
    "condition",
    "true_computation",
    "false_computation",
    "branch_computations",
    "called_computations",
)
_NAME_RE = re.compile(r"%?([A-Za-z_][\w.\-]*)")


# ---------------------------------------------------------------- layouts


def _label_string(labels: str, letters: Mapping[str, str], spatial: str) -> str:
    out = []
    for c in labels:
        if c.isdigit():
            out.append(spatial[int(c)] if int(c) < len(spatial) else c)
        else:
            out.append(letters.get(c, c))
    return "".join(out)


def decode_dim_labels(dim_labels: str) -> dict[str, str]:
    """``"bf01_oi01->bf01"`` -> ``{"input": "NCHW", "kernel": "OIHW", "output": "NCHW"}``.

    Letters follow the array's dims in order: ``N`` batch, ``C`` features, ``O``/``I`` kernel
    output/input features, spatial dims ``W`` (1D), ``HW`` (2D) or ``DHW`` (3D).
    """
    m = re.fullmatch(r"\s*(\w+)_(\w+)->(\w+)\s*", dim_labels)
    if not m:
        raise ValueError(f"cannot read dim_labels {dim_labels!r}; expected e.g. 'b01f_01io->b01f'")
    lhs, rhs, out = m.groups()
    n_spatial = sum(c.isdigit() for c in lhs)
    spatial = _SPATIAL_LETTERS.get(n_spatial, "".join(str(i) for i in range(n_spatial)))
    return {
        "input": _label_string(lhs, _ACTIVATION_LETTERS, spatial),
        "kernel": _label_string(rhs, _KERNEL_LETTERS, spatial),
        "output": _label_string(out, _ACTIVATION_LETTERS, spatial),
    }


def physical_order(logical: str, shape: ArrayShape | None) -> str | None:
    """Reorder ``logical`` (one letter per dim) from slowest to fastest in memory."""
    if shape is None or len(logical) != len(shape.dims):
        return None
    return "".join(logical[d] for d in shape.major_to_minor)


def parse_window(text: str | None) -> Window | None:
    """``"{size=3x3 stride=2x2 pad=1_1x1_1}"`` -> ``Window`` with defaults filled in."""
    if not text:
        return None
    fields = dict(tok.split("=", 1) for tok in text.strip("{} ").split() if "=" in tok)
    if "size" not in fields:
        return None
    size = tuple(int(x) for x in fields["size"].split("x"))
    n = len(size)

    def ints(key: str, default: int) -> tuple[int, ...]:
        return tuple(int(x) for x in fields[key].split("x")) if key in fields else (default,) * n

    pad = (
        tuple(tuple(int(v) for v in p.split("_")) for p in fields["pad"].split("x"))
        if "pad" in fields
        else ((0, 0),) * n
    )
    return Window(size, ints("stride", 1), pad, ints("lhs_dilate", 1), ints("rhs_dilate", 1))


# ---------------------------------------------------------------- computation kinds


def _called(ins: Instruction) -> list[tuple[str, str]]:
    calls = []
    for attr in _CALL_ATTRS:
        if attr in ins.attrs:
            for name in _NAME_RE.findall(ins.attrs[attr]):
                calls.append((attr, name))
    return calls


def classify_computations(module: HloModule) -> tuple[dict[str, str], dict[str, str | None]]:
    """Kind of each computation and the fusion instruction that runs it.

    Kinds: ``entry``; ``fusion`` (body of a fusion, or anything called from one); ``applied``
    (``to_apply`` scalar lambdas of reduce/map/sort...); ``control`` (while/conditional/call
    bodies, and computations nothing calls).
    """
    kinds = {name: "entry" for name, c in module.computations.items() if c.is_entry}
    fusion_of: dict[str, str | None] = {name: None for name in kinds}
    queue = list(kinds)
    while queue:
        parent = queue.pop()
        comp = module.computations.get(parent)
        if comp is None:
            continue
        for ins in comp.instructions:
            for attr, child in _called(ins):
                if child in kinds or child not in module.computations:
                    continue
                if attr == "to_apply":
                    kinds[child] = "applied"
                elif ins.opcode == "fusion" or kinds[parent] == "fusion":
                    kinds[child] = "fusion"
                else:
                    kinds[child] = kinds[parent] if kinds[parent] != "entry" else "control"
                fusion_of[child] = ins.name if ins.opcode == "fusion" else fusion_of[parent]
                queue.append(child)
    for name in module.computations:
        kinds.setdefault(name, "control")
        fusion_of.setdefault(name, None)
    return kinds, fusion_of


# ---------------------------------------------------------------- extraction


def _ints(text: str | None) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"-?\d+", text)) if text else ()


def _unquote(text: str | None) -> str | None:
    return text.strip().strip('"') if text is not None else None


def _operand(ins: Instruction, i: int) -> ArrayShape | None:
    if i >= len(ins.operand_shapes):
        return None
    s = ins.operand_shapes[i]
    return s if isinstance(s, ArrayShape) else first_array(s)


def _permutes(ins: Instruction) -> bool | None:
    src, dst = _operand(ins, 0), first_array(ins.shape)
    if src is None or dst is None:
        return None
    if ins.opcode == "transpose":
        perm = _ints(ins.attrs.get("dimensions"))
        if len(perm) != len(dst.dims):
            return None
        # result dim i is operand dim perm[i]; equal memory order means a bitcast.
        return tuple(perm[d] for d in dst.major_to_minor) != src.major_to_minor
    if ins.opcode == "copy":
        return src.major_to_minor != dst.major_to_minor
    return False


def _data_move(ins: Instruction, fusion: str | None) -> DataMoveOp:
    operand_bytes = [shape_bytes(s) for s in ins.operand_shapes]
    bytes_in = None if any(b is None for b in operand_bytes) else sum(operand_bytes)
    dims = _ints(ins.attrs.get("dimensions")) if ins.opcode == "transpose" else None
    return DataMoveOp(
        name=ins.name,
        opcode=ins.opcode,
        computation=ins.computation,
        fusion=fusion,
        operand=_operand(ins, 0),
        result=first_array(ins.shape),
        bytes_in=bytes_in if ins.operand_shapes else None,
        bytes_out=shape_bytes(ins.shape),
        permutes_memory=_permutes(ins),
        dimensions=dims,
    )


def _is_conv(ins: Instruction) -> bool:
    """XLA's own convs: ``convolution`` ops and the backend's conv custom-calls (cuDNN's).
    layoutlab's oneDNN calls have no layouts for XLA to choose; ``onednn_kind`` counts them."""
    if ins.opcode == "convolution":
        return True
    target = (_unquote(ins.attrs.get("custom_call_target")) or "").lower()
    return ins.opcode == "custom-call" and "conv" in target and onednn_kind(target) is None


# The prefix of every custom-call target of the onednn conv algorithm
# (``nn.conv_algos.onednn.TARGET_PREFIX``; read here without loading that module's extension).
ONEDNN_PREFIX = "layoutlab_onednn_"
_ONEDNN_KINDS = (
    ("backward weights", {"dw", "weight", "weights", "wei"}),
    ("backward data", {"dx", "data"}),
    ("forward", {"fwd", "forward"}),
)
# The kinds of the conv calls; another oneDNN call (``batch_norm``, ``batch_norm_grad``) is
# known by its suffix.
ONEDNN_CONV_KINDS = tuple(kind for kind, _ in _ONEDNN_KINDS)


def onednn_kind(target: str | None) -> str | None:
    """``"forward"``, ``"backward data"`` or ``"backward weights"`` for a oneDNN conv's
    custom-call target (by its suffix, e.g. ``layoutlab_onednn_conv_bwd_data``), the suffix
    itself for another oneDNN call, None for a target that is not oneDNN's."""
    if not target or not target.startswith(ONEDNN_PREFIX):
        return None
    suffix = target[len(ONEDNN_PREFIX) :]
    words = set(suffix.lower().split("_"))
    return next((kind for kind, keys in _ONEDNN_KINDS if words & keys), suffix)


def _is_dot(ins: Instruction) -> bool:
    if ins.opcode == "dot":
        return True
    target = (_unquote(ins.attrs.get("custom_call_target")) or "").lower()
    return ins.opcode == "custom-call" and ("gemm" in target or "matmul" in target)


def _call_site(ins: Instruction, fusion: str | None) -> dict:
    """The fields a conv or dot record starts with: which instruction, where it runs."""
    return dict(
        name=ins.name,
        opcode=ins.opcode,
        target=_unquote(ins.attrs.get("custom_call_target")),
        computation=ins.computation,
        fusion=fusion,
    )


def _conv(ins: Instruction, fusion: str | None) -> ConvOp:
    labels = ins.attrs.get("dim_labels")
    lhs, rhs, out = _operand(ins, 0), _operand(ins, 1), first_array(ins.shape)
    logical = physical = None
    if labels:
        logical = decode_dim_labels(labels)
        physical = {
            "input": physical_order(logical["input"], lhs),
            "kernel": physical_order(logical["kernel"], rhs),
            "output": physical_order(logical["output"], out),
        }
    return ConvOp(
        **_call_site(ins, fusion),
        dim_labels=labels,
        lhs=lhs,
        rhs=rhs,
        out=out,
        feature_group_count=int(ins.attrs.get("feature_group_count", 1)),
        batch_group_count=int(ins.attrs.get("batch_group_count", 1)),
        window=parse_window(ins.attrs.get("window")),
        logical=logical,
        physical=physical,
    )


def _dot(ins: Instruction, fusion: str | None) -> DotOp:
    return DotOp(
        **_call_site(ins, fusion),
        lhs=_operand(ins, 0),
        rhs=_operand(ins, 1),
        out=first_array(ins.shape),
        lhs_contracting_dims=_ints(ins.attrs.get("lhs_contracting_dims")),
        rhs_contracting_dims=_ints(ins.attrs.get("rhs_contracting_dims")),
        lhs_batch_dims=_ints(ins.attrs.get("lhs_batch_dims")),
        rhs_batch_dims=_ints(ins.attrs.get("rhs_batch_dims")),
    )


def fusion_kind(ins: Instruction) -> str:
    """A fusion instruction's kind, e.g. ``kLoop``; ``kCustom(name)`` for a custom one."""
    kind = ins.attrs.get("kind", "?")
    if kind == "kCustom":
        m = re.search(r'"?kind"?\s*:\s*"([^"]+)"', ins.attrs.get("backend_config", ""))
        if m:
            return f"kCustom({m.group(1)})"
    return kind


def op_records(ins: Instruction, computation: str, fusion: str | None) -> list[tuple[str, object]]:
    """The records ``ins`` adds to a report, each with the list it goes to: ``"transpose"``,
    ``"copy"``, ``"convert"``, ``"conv"``, ``"dot"`` or ``"custom"``."""
    found: list[tuple[str, object]] = []
    if ins.opcode in ("transpose", "copy", "convert"):
        found.append((ins.opcode, _data_move(ins, fusion)))
    if _is_conv(ins):
        found.append(("conv", _conv(ins, fusion)))
    elif _is_dot(ins):
        found.append(("dot", _dot(ins, fusion)))
    if ins.opcode == "custom-call":
        target = _unquote(ins.attrs.get("custom_call_target")) or "?"
        call = CustomCallOp(ins.name, target, computation, fusion, ins.operand_shapes, ins.shape)
        found.append(("custom", call))
    return found
