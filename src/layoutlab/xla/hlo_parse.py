"""A small parser for XLA's HLO text: modules, computations, instructions and shapes.

It reads what ``compiled.as_text()`` and ``lowered.as_text(dialect="hlo")`` print, and the
hand-written HLO found in XLA tests: ``%`` prefixes or none, operands printed with or without
their shapes, tuple shapes, ``/*index=5*/`` comments, attributes with nested braces and quoted
strings (``metadata={...}``, ``backend_config={...}``), layouts such as ``{3,2,1,0}`` or
``{1,0:T(8,128)}``, and instructions spread over several lines. Sections that are not
computations (``FileNames``, ``StackFrames``...) are skipped.
"""

from __future__ import annotations

import dataclasses
import math
import re

__all__ = [
    "ArrayShape",
    "Computation",
    "HloModule",
    "HloParseError",
    "Instruction",
    "parse_hlo",
    "parse_shape",
    "shape_bytes",
]

# Bits per element; sub-byte types are packed, so byte counts are rounded up per array.
_DTYPE_BITS = {
    "pred": 8,
    "s1": 1,
    "u1": 1,
    "s2": 2,
    "u2": 2,
    "s4": 4,
    "u4": 4,
    "s8": 8,
    "u8": 8,
    "s16": 16,
    "u16": 16,
    "f16": 16,
    "bf16": 16,
    "s32": 32,
    "u32": 32,
    "f32": 32,
    "s64": 64,
    "u64": 64,
    "f64": 64,
    "c64": 64,
    "c128": 128,
    "token": 0,
    "opaque": 0,
}

_OPEN = "([{"
_CLOSE = ")]}"


class HloParseError(ValueError):
    """The text is not HLO this parser can read."""


def dtype_bits(dtype: str) -> int | None:
    """Bits per element of an HLO element type such as ``bf16``; None when unknown."""
    if dtype in _DTYPE_BITS:
        return _DTYPE_BITS[dtype]
    m = re.fullmatch(r"f(\d+)e\d+m\d+\w*", dtype)  # f8e4m3fn, f4e2m1fn, f8e8m0fnu...
    return int(m.group(1)) if m else None


@dataclasses.dataclass(frozen=True)
class ArrayShape:
    """One array shape: element type, dims, and the ``{minor_to_major}`` layout if printed."""

    dtype: str
    dims: tuple[int, ...]
    minor_to_major: tuple[int, ...] | None = None
    layout_suffix: str | None = None  # tiling / memory space after ':' e.g. "T(8,128)"

    @property
    def size(self) -> int:
        return math.prod(self.dims)

    @property
    def nbytes(self) -> int | None:
        bits = dtype_bits(self.dtype)
        return None if bits is None else (self.size * bits + 7) // 8

    @property
    def major_to_minor(self) -> tuple[int, ...]:
        """Dims from slowest to fastest varying in memory; row-major when no layout is given."""
        if self.minor_to_major is None:
            return tuple(range(len(self.dims)))
        return tuple(reversed(self.minor_to_major))

    @property
    def is_default_layout(self) -> bool:
        return self.major_to_minor == tuple(range(len(self.dims)))

    def __str__(self) -> str:
        text = f"{self.dtype}[{','.join(map(str, self.dims))}]"
        if self.minor_to_major is not None:
            suffix = f":{self.layout_suffix}" if self.layout_suffix else ""
            text += "{" + ",".join(map(str, self.minor_to_major)) + suffix + "}"
        return text


Shape = ArrayShape | tuple  # a tuple shape holds Shapes


def shape_bytes(shape: Shape | None) -> int | None:
    """Bytes of an array or tuple shape; None when any element size is unknown."""
    if shape is None:
        return None
    if isinstance(shape, ArrayShape):
        return shape.nbytes
    parts = [shape_bytes(s) for s in shape]
    return None if any(p is None for p in parts) else sum(parts)


def first_array(shape: Shape | None) -> ArrayShape | None:
    """The shape itself, or the first array of a tuple (e.g. a cuDNN conv's result)."""
    while isinstance(shape, tuple):
        if not shape:
            return None
        shape = shape[0]
    return shape


@dataclasses.dataclass
class Instruction:
    name: str
    opcode: str
    shape: Shape
    operands: tuple[str, ...]
    attrs: dict[str, str]
    computation: str
    is_root: bool = False
    operand_shapes: tuple[Shape | None, ...] = ()


@dataclasses.dataclass
class Computation:
    name: str
    is_entry: bool
    instructions: list[Instruction]


@dataclasses.dataclass
class HloModule:
    name: str | None
    computations: dict[str, Computation]

    @property
    def entry(self) -> Computation | None:
        for comp in self.computations.values():
            if comp.is_entry:
                return comp
        return None


# ---------------------------------------------------------------- low-level scanning


# A double-quoted string, with backslash escapes; one left open runs to the end of the text.
_STRING_RE = re.compile(r'"(?:[^"\\]|\\.)*"?', re.DOTALL)
_STRING_OR_COMMENT_RE = re.compile(r'("(?:[^"\\]|\\.)*"?)|/\*.*?(?:\*/|\Z)', re.DOTALL)


def strip_comments(text: str) -> str:
    """Drop ``/* ... */`` comments that are outside double-quoted strings."""
    return _STRING_OR_COMMENT_RE.sub(lambda m: m.group(1) or "", text)


def _blank_strings(text: str) -> str:
    """``text`` with every quoted string replaced by spaces, so that brackets and separators
    inside strings are not seen; the indices stay those of ``text``."""
    return _STRING_RE.sub(lambda m: " " * len(m.group()), text)


def _depth_change(text: str) -> int:
    """Net bracket depth of ``text``, ignoring brackets inside quoted strings."""
    bare = _blank_strings(text)
    return sum(bare.count(c) for c in _OPEN) - sum(bare.count(c) for c in _CLOSE)


def matching_close(text: str, start: int) -> int:
    """Index of the bracket closing the one at ``text[start]``."""
    depth = 0
    for i, c in enumerate(_blank_strings(text[start:]), start):
        if c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
            if depth == 0:
                return i
    raise HloParseError(f"unbalanced brackets in: {text[start : start + 120]!r}")


def split_top(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` where it is outside brackets and quotes; pieces are stripped."""
    parts, depth, begin = [], 0, 0
    for i, c in enumerate(_blank_strings(text)):
        if c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
        elif c == sep and depth == 0:
            parts.append(text[begin:i].strip())
            begin = i + 1
    last = text[begin:].strip()
    if last:
        parts.append(last)
    return parts


# ---------------------------------------------------------------- shapes

_ARRAY_RE = re.compile(r"([a-z][a-z0-9]*)\[([^\]]*)\](\{[^{}]*\})?")


def _parse_dims(text: str) -> tuple[int, ...]:
    dims = []
    for d in text.split(","):
        d = d.strip().removeprefix("<=")  # bounded dynamic dims print as <=N
        if not d:
            continue
        if d == "?":
            raise HloParseError("unbounded dynamic dimension '?' has no static size")
        dims.append(int(d))
    return tuple(dims)


def _parse_layout(text: str | None) -> tuple[tuple[int, ...] | None, str | None]:
    if text is None:
        return None, None
    body = text[1:-1]
    m2m, _, suffix = body.partition(":")
    m2m = m2m.strip()
    order = tuple(int(x) for x in m2m.split(",") if x.strip()) if m2m else ()
    return order, (suffix.strip() or None)


def parse_shape_prefix(text: str) -> tuple[Shape, int]:
    """Parse the shape at the start of ``text``; returns it and where it ends."""
    stripped = text.lstrip()
    offset = len(text) - len(stripped)
    if stripped.startswith("("):
        end = matching_close(stripped, 0)
        inner = stripped[1:end]
        elements = tuple(parse_shape(part) for part in split_top(inner)) if inner.strip() else ()
        return elements, offset + end + 1
    m = _ARRAY_RE.match(stripped)
    if not m:
        raise HloParseError(f"cannot read a shape at: {stripped[:80]!r}")
    m2m, suffix = _parse_layout(m.group(3))
    shape = ArrayShape(m.group(1), _parse_dims(m.group(2)), m2m, suffix)
    return shape, offset + m.end()


def parse_shape(text: str) -> Shape:
    """``"bf16[2,3]{1,0}"`` -> ``ArrayShape``; ``"(f32[2], u8[0])"`` -> a tuple of shapes."""
    shape, end = parse_shape_prefix(text)
    if text[end:].strip():
        raise HloParseError(f"unexpected text after shape: {text[end:]!r}")
    return shape


# ---------------------------------------------------------------- statements

_HEADER_RE = re.compile(r"^(ENTRY\s+)?%?([A-Za-z_][\w.\-]*)\s*(\(.*\)\s*->.*)?\{\s*$")
_INSTR_START_RE = re.compile(r"^\s*(ROOT\s+)?%?([A-Za-z_][\w.\-]*)\s*=\s*(?=\(|[a-z][a-z0-9]*\[)")
_OPCODE_RE = re.compile(r"\s*([a-z][\w\-]*)\(")


def _operand_name(text: str) -> str:
    # Operands print as "%x", "x" or, in older text, "f32[2]{0} %x".
    token = text.split()[-1] if text.split() else text
    return token.lstrip("%")


def parse_instruction(statement: str, computation: str) -> Instruction:
    m = _INSTR_START_RE.match(statement)
    if not m:
        raise HloParseError(f"not an instruction: {statement[:120]!r}")
    rest = statement[m.end() :]
    shape, end = parse_shape_prefix(rest)
    rest = rest[end:]
    om = _OPCODE_RE.match(rest)
    if not om:
        raise HloParseError(f"no opcode in: {statement[:160]!r}")
    open_at = om.end() - 1
    close_at = matching_close(rest, open_at)
    operands = tuple(_operand_name(op) for op in split_top(rest[open_at + 1 : close_at]))
    attrs = {}
    for part in split_top(rest[close_at + 1 :].lstrip().lstrip(",")):
        key, eq, value = part.partition("=")
        attrs[key.strip()] = value.strip() if eq else ""
    return Instruction(
        name=m.group(2),
        opcode=om.group(1),
        shape=shape,
        operands=operands,
        attrs=attrs,
        computation=computation,
        is_root=bool(m.group(1)),
    )


def _statements(body_lines: list[str]) -> list[str]:
    """Join instruction lines with their continuation lines."""
    statements: list[str] = []
    for line in body_lines:
        if not line.strip():
            continue
        if _INSTR_START_RE.match(line) or not statements:
            statements.append(line.strip())
        else:
            statements[-1] += " " + line.strip()
    return [s for s in statements if s]


def parse_hlo(text: str) -> HloModule:
    """Parse HLO module text into computations and instructions with resolved operand shapes."""
    if not isinstance(text, str) or not text.strip():
        raise HloParseError("expected HLO text, got an empty or non-string value")
    text = strip_comments(text)
    module_name = None
    computations: dict[str, Computation] = {}
    current: tuple[str, bool] | None = None
    body: list[str] = []
    depth = 0
    for line in text.splitlines():
        stripped = line.strip()
        if current is None:
            if stripped.startswith("HloModule"):
                module_name = stripped.split()[1].rstrip(",") if len(stripped.split()) > 1 else None
                continue
            hm = _HEADER_RE.match(stripped)
            if hm:
                current, body, depth = (hm.group(2), bool(hm.group(1))), [], 0
            continue
        if depth == 0 and stripped.startswith("}") and not _INSTR_START_RE.match(line):
            name, is_entry = current
            instrs = [parse_instruction(s, name) for s in _statements(body)]
            computations[name] = Computation(name, is_entry, instrs)
            current = None
            continue
        if _INSTR_START_RE.match(line):
            depth = 0
        depth += _depth_change(line)
        body.append(line)
    if current is not None:
        raise HloParseError(f"computation {current[0]!r} is not closed with '}}'")
    if not computations:
        raise HloParseError("no computations found; is this HLO text (not StableHLO/MLIR)?")
    module = HloModule(module_name, computations)
    _resolve_operands(module)
    return module


def _resolve_operands(module: HloModule) -> None:
    for comp in module.computations.values():
        table = {ins.name: ins.shape for ins in comp.instructions}
        for ins in comp.instructions:
            ins.operand_shapes = tuple(table.get(op) for op in ins.operands)
