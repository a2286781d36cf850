"""``ConvPlan``: which algorithm each ``algorithm="auto"`` conv of a model runs, as a value.

A plan maps a conv's path in the model (``"layer1/0/conv1"``, as ``conv_config.convs``
names it) to a ``PlanEntry``: the algorithm, the spec key of the shape it was chosen on
(``ConvSpec.key()``) and, optionally, the evidence (times, device, versions). Autotuning
produces plans (``layoutlab.bench.tuning``), runs store them in their config and
checkpoints, and ``nn.configure(model, plan, algorithms=...)`` hands one to a copy of a
model. Nothing process-wide is read while a step is traced: an ``"auto"`` conv runs its own
entry, and one with no entry, or traced at another shape than its entry's, runs XLA's
native conv.
"""

from __future__ import annotations

import json
import types
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from layoutlab.nn.conv_names import AUTO

__all__ = ["PLAN_FORMAT", "WIDE_DTYPES", "ConvPlan", "PlanEntry", "as_plan", "load_plan"]


PLAN_FORMAT = "layoutlab.conv_plan/1"


# The compute dtypes an entry may widen a half-precision conv to.
WIDE_DTYPES = ("float32",)


class PlanEntry(NamedTuple):
    """What one conv runs, and the ``spec_key`` it was chosen for (also what a ``Conv``
    carries as a static attribute, so it is part of the jitted program's cache key).

    ``compute_dtype``: None, or ``"float32"`` for a half-precision conv that multiplies its
    operands widened to float32 (exact: every bfloat16 is a float32) with ``algorithm``'s
    float32 kernel, its result rounded to the conv's dtype as before: the shipped table's
    entries for ``mixed_bf16`` convs on a CPU without bfloat16 units."""

    algorithm: str
    spec_key: str
    compute_dtype: str | None = None


def _check_entry(path: str, algorithm: Any, spec_key: Any, compute_dtype: Any = None) -> PlanEntry:
    if not isinstance(algorithm, str) or not isinstance(spec_key, str) or not spec_key:
        raise ValueError(
            f"conv plan entry {path!r} needs string 'algorithm' and 'spec_key' fields, got "
            f"algorithm={algorithm!r}, spec_key={spec_key!r}; regenerate the plan with "
            "`layoutlab autotune convs --out plan.json`."
        )
    if compute_dtype is not None and compute_dtype not in WIDE_DTYPES:
        raise ValueError(
            f"conv plan entry {path!r}: compute_dtype must be one of {WIDE_DTYPES} or absent, "
            f"got {compute_dtype!r}; regenerate the plan with "
            "`layoutlab autotune convs --out plan.json`."
        )
    # A plan file names algorithms: here they are parsed (the table is imported on first use,
    # so holding a plan, as a TrainConfig does, imports no JAX).
    from layoutlab.nn.conv_algos.registry import check_name

    try:
        check_name(algorithm)
    except ValueError as err:
        raise ValueError(f"conv plan entry {path!r}: {err}") from None
    if algorithm == AUTO:
        raise ValueError(
            f"conv plan entry {path!r} says 'auto'; a plan names the algorithm that runs "
            "(e.g. 'xla' or 'im2col')."
        )
    return PlanEntry(algorithm, spec_key, compute_dtype)


def _frozen_json(value: Any) -> Any:
    """A read-only deep copy of a JSON-like value (mappings become ``MappingProxyType``)."""
    if isinstance(value, Mapping):
        return types.MappingProxyType({str(k): _frozen_json(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(_frozen_json(v) for v in value)
    return value


def _plain_json(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain_json(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_plain_json(v) for v in value]
    return value


class ConvPlan:
    """An immutable mapping ``path -> PlanEntry`` plus per-path ``evidence`` (read-only
    JSON-like data, compared but not hashed). Equal plans compare and hash equal."""

    __slots__ = ("_entries", "_evidence")

    def __init__(
        self,
        entries: Mapping[str, PlanEntry | tuple[str, ...]] | None = None,
        evidence: Mapping[str, Mapping] | None = None,
    ):
        checked = {str(p): _check_entry(p, *tuple(e)) for p, e in sorted((entries or {}).items())}
        extra = sorted(set(evidence or {}) - set(checked))
        if extra:
            raise ValueError(f"conv plan evidence for paths without an entry: {extra}.")
        object.__setattr__(self, "_entries", types.MappingProxyType(checked))
        frozen = {p: _frozen_json(v) for p, v in sorted((evidence or {}).items())}
        object.__setattr__(self, "_evidence", types.MappingProxyType(frozen))

    def __setattr__(self, name, value):
        raise AttributeError("ConvPlan is immutable; build a new one.")

    # Immutable, so a copy is the plan itself (dataclasses.asdict deep-copies its fields).
    def __copy__(self) -> ConvPlan:
        return self

    def __deepcopy__(self, memo) -> ConvPlan:
        return self

    def __reduce__(self):
        return (ConvPlan.from_dict, (self.to_dict(),))

    def __getitem__(self, path: str) -> PlanEntry:
        return self._entries[path]

    def get(self, path: str, default=None) -> PlanEntry | None:
        return self._entries.get(path, default)

    def __contains__(self, path: object) -> bool:
        return path in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def items(self):
        return self._entries.items()

    def evidence(self, path: str) -> Mapping | None:
        return self._evidence.get(path)

    def algorithms(self) -> dict[str, str]:
        """``{path: algorithm}``."""
        return {p: e.algorithm for p, e in self._entries.items()}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ConvPlan):
            return NotImplemented
        return dict(self._entries) == dict(other._entries) and _plain_json(
            self._evidence
        ) == _plain_json(other._evidence)

    def __hash__(self) -> int:
        return hash(tuple(self._entries.items()))

    def __repr__(self) -> str:
        body = ", ".join(
            f"{p!r}: {e.algorithm}" + (f"@{e.compute_dtype}" if e.compute_dtype else "")
            for p, e in self._entries.items()
        )
        return f"ConvPlan({{{body}}})"

    def to_dict(self) -> dict:
        """The JSON form: ``{"format", "convs": {path: {algorithm, spec_key[, compute_dtype]
        [, evidence]}}}``."""
        convs = {}
        for path, entry in self._entries.items():
            convs[path] = {"algorithm": entry.algorithm, "spec_key": entry.spec_key}
            if entry.compute_dtype is not None:
                convs[path]["compute_dtype"] = entry.compute_dtype
            if path in self._evidence:
                convs[path]["evidence"] = _plain_json(self._evidence[path])
        return {"format": PLAN_FORMAT, "convs": convs}

    @classmethod
    def from_dict(cls, data: Any) -> ConvPlan:
        """The inverse of ``to_dict``; anything else raises ``ValueError`` naming the fix."""
        if isinstance(data, ConvPlan):
            return data
        fix = "regenerate it with `layoutlab autotune convs --out plan.json`"
        if not isinstance(data, Mapping) or not isinstance(data.get("convs"), Mapping):
            raise ValueError(
                f"A conv plan is a mapping with a 'convs' mapping (format {PLAN_FORMAT}); "
                f"got {type(data).__name__}; {fix}."
            )
        if data.get("format", PLAN_FORMAT) != PLAN_FORMAT:
            raise ValueError(
                f"conv plan format {data.get('format')!r} is not {PLAN_FORMAT!r}; {fix}."
            )
        entries, evidence = {}, {}
        for path, item in data["convs"].items():
            if not isinstance(item, Mapping):
                raise ValueError(f"conv plan entry {path!r} is not a mapping; {fix}.")
            entries[str(path)] = (
                item.get("algorithm"),
                item.get("spec_key"),
                item.get("compute_dtype"),
            )
            if item.get("evidence") is not None:
                evidence[str(path)] = item["evidence"]
        return cls(entries, evidence)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, *, source: str = "conv plan") -> ConvPlan:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(
                f"{source} is not valid JSON ({err}); pass a file written by "
                "`layoutlab autotune convs --out plan.json`."
            ) from None
        return cls.from_dict(data)

    def save(self, path: str | Path) -> Path:
        path = Path(path).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json() + "\n")
        return path


def load_plan(path: str | Path) -> ConvPlan:
    """The plan saved at ``path``; a missing or malformed file raises ``ValueError``."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ValueError(
            f"No conv plan at {path}; write one with `layoutlab autotune convs --out {path}`."
        )
    return ConvPlan.from_json(path.read_text(), source=str(path))


def as_plan(plan: ConvPlan | Mapping | None) -> ConvPlan:
    """``plan`` as a ``ConvPlan`` (``None``: the empty plan; a dict: its JSON form)."""
    return ConvPlan() if plan is None else ConvPlan.from_dict(plan)
