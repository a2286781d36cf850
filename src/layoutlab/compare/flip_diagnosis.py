"""Rerunning a candidate's gradients on the reference's ReLU/max-pool decisions, the
check that tells a gradient error caused by decision flips (``compare.decisions``) from
one that is not."""

from __future__ import annotations

from typing import Any

from flax import nnx

from layoutlab.compare.decisions import Decision, decision_flips
from layoutlab.compare.gradients import ProbedGrads, grads_to_layout, probed_parameter_grads
from layoutlab.compare.layer_recording import model_layout
from layoutlab.layout import Layout

__all__ = ["decisions_note", "layers_layout", "pinned_rerun"]


def layers_layout(model: nnx.Module) -> Layout:
    """The layout ``model``'s layers compute in (its activation storage), where its
    decisions are recorded."""
    return getattr(model, "compute_layout", None) or model_layout(model)


def pinned_rerun(
    model: nnx.Module,
    x: Any,
    labels: Any,
    train: bool,
    compiler_options: dict | None,
    reference_decisions: list[Decision],
    run: ProbedGrads,
    decisions_layout: Layout,
    layout: Layout | None = None,
) -> dict[str, Any]:
    """The ``GradientPair`` fields of the flip diagnosis: where ``run`` (the candidate's
    probed gradients) decided differently from the reference (whose decisions are in
    ``decisions_layout``) and, if anywhere, the candidate's gradients recomputed with every
    decision pinned to the reference's (moved to ``layout`` when given, as the candidate's
    gradients are)."""
    matched = decision_flips(
        reference_decisions, run.decisions, decisions_layout, layers_layout(model)
    )
    if matched is None:
        return {"decisions": "not matched (the runs' ReLU/max-pool sequences differ)"}
    flips, pins = matched
    if not flips:
        return {"done": tuple(run.done), "decisions": decisions_note(flips)}
    pinned = probed_parameter_grads(
        model, x, labels, train=train, compiler_options=compiler_options, pins=pins
    ).grads
    if layout is not None:
        pinned = grads_to_layout(model, pinned, layout)
    return {
        "pinned": pinned,
        "flips": tuple(flips),
        "done": tuple(run.done),
        "decisions": decisions_note(flips),
    }


def decisions_note(flips) -> str:
    """The report's ``decisions`` line, told from the flips it counts (``decision_flips``'s
    sites): "matched" only where none differ."""
    if not flips:
        return "matched: every ReLU/max-pool decision is the reference's"
    count = sum(f.count for f in flips)
    return (
        f"{count} differ from the reference's at {len(flips)} site(s); the rows they reach "
        "are judged on a rerun with the reference's decisions pinned"
    )
