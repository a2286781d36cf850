"""The result of checking a model against one reference: the output, and optionally every
layer's output and every parameter's gradient (``references``, ``torch_reference``)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from layoutlab.compare.layer_report import LayerwiseReport
from layoutlab.compare.report import CompareReport

__all__ = ["ReferenceReport"]


@dataclasses.dataclass(frozen=True)
class ReferenceReport:
    """A model checked against one reference: the output, and optionally every layer's
    output and every parameter's gradient."""

    against: str
    reference: str
    candidate: str
    tolerance: str
    output: CompareReport
    layers: LayerwiseReport | None = None
    grads: LayerwiseReport | None = None
    settings: dict = dataclasses.field(default_factory=dict)

    @property
    def passed(self) -> bool:
        parts = [self.output.passed]
        parts += [p.passed for p in (self.layers, self.grads) if p is not None]
        return all(parts)

    def depth_profile(self) -> list[dict]:
        """Error per depth (execution index of each layer); empty without layers."""
        return self.layers.depth_profile() if self.layers is not None else []

    def __str__(self) -> str:
        verdict = "PASSED" if self.passed else "FAILED"
        lines = [
            f"compare against {self.against}: {verdict}",
            f"  candidate: {self.candidate}",
            f"  reference: {self.reference}",
            f"  tolerance: {self.tolerance}",
        ]
        lines += [f"  {k}: {v}" for k, v in self.settings.items()]
        lines += ["", str(self.output)]
        for part in (self.layers, self.grads):
            if part is not None:
                lines += ["", str(part)]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "against": self.against,
            "reference": self.reference,
            "candidate": self.candidate,
            "tolerance": self.tolerance,
            "passed": self.passed,
            "settings": json.loads(json.dumps(self.settings, default=str)),
            "output": self.output.to_dict(),
            "layers": self.layers.to_dict() if self.layers is not None else None,
            "grads": self.grads.to_dict() if self.grads is not None else None,
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReferenceReport:
        def part(d):
            return LayerwiseReport.from_dict(d) if d is not None else None

        return cls(
            against=data["against"],
            reference=data["reference"],
            candidate=data["candidate"],
            tolerance=data["tolerance"],
            output=CompareReport.from_dict(data["output"]),
            layers=part(data.get("layers")),
            grads=part(data.get("grads")),
            settings=dict(data.get("settings", {})),
        )
