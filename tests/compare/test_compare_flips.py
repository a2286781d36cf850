"""Gradient comparisons name ReLU/max-pool decision flips: a row reached by a flip is judged
on the rerun with the reference's decisions pinned and says ``flips: N at site``; an error
the flips do not explain fails. The CLI's test plants its flip in the float64 reference, so
it does not depend on this CPU's rounding (a real ResNet-18 problem flipped on one machine
and not on another). The mechanism itself (a flip in a jitted ResNet-18, float64's
decisions pinned) is tested in test_grad_numerics_torchvision.py."""

import argparse
import json

import jax
import numpy as np
import pytest
from compare_helpers import fast_model, random_input
from flax import nnx

from layoutlab.compare import command
from layoutlab.compare.decisions import FlipSite, decision_flips, probe_decisions
from layoutlab.compare.gradients import compare_grad_trees, probed_parameter_grads
from layoutlab.compare.layer_report import LayerwiseReport
from layoutlab.compare.references import default_layer_tolerance

TOL = default_layer_tolerance(np.float32)
# The audit's compiled ResNet-18 input gradient was 5.8e-2 x its largest value off.
AUDIT_ERROR = 5.8e-2


@pytest.fixture(scope="module")
def run():
    model = fast_model("small_cnn")
    x = random_input("small_cnn", "NHWC", 4)
    labels = np.arange(4, dtype=np.int32) % 5
    return model, x, labels, probed_parameter_grads(model, x, labels, train=True)


def _with_error(grads: nnx.State, path: str) -> nnx.State:
    """``grads`` with ``AUDIT_ERROR`` x the row's largest value added to one element."""
    flat = dict(nnx.to_flat_state(grads))
    key = next(k for k in flat if ".".join(map(str, k)) == path)
    value = np.array(flat[key].get_value())
    value.flat[0] += AUDIT_ERROR * np.max(np.abs(value))
    out = jax.tree.map(lambda v: v, grads)
    nnx.to_flat_state(out)  # same structure
    flat_out = dict(nnx.to_flat_state(out))
    flat_out[key].set_value(value)
    return nnx.from_flat_state(flat_out)


def _site_after(done, layer):
    return done.index(layer) + 1


def _report(run, candidate, pinned, flips) -> LayerwiseReport:
    model, _, _, ref = run
    return compare_grad_trees(
        model, ref.grads, candidate, TOL, order=ref.order, pinned=pinned, flips=flips,
        done=ref.done,
    )  # fmt: skip


def test_run_records_every_relu_and_max_pool_decision(run):
    _, _, _, ref = run
    kinds = [(d.site, d.kind) for d in ref.decisions]
    assert kinds == [
        ("features.0.2", "relu"), ("features.1.2", "relu"), ("features.2", "max_pool"),
        ("features.3.2", "relu"), ("classifier.1", "relu"),
    ]  # fmt: skip
    flips, pins = decision_flips(ref.decisions, ref.decisions)
    assert flips == [] and list(pins) == [site for site, _ in kinds]
    mask = np.asarray(ref.decisions[0].value)
    assert mask.dtype == bool and 0 < mask.mean() < 1  # a real mask, not all or nothing


def test_error_explained_by_flips_is_named_not_failed(run):
    model, _, _, ref = run
    flips = [FlipSite("features.1.2", "relu", 3, _site_after(ref.done, "features.1.2"))]
    wrong = _with_error(ref.grads, "features.layers.0.layers.0.kernel")
    report = _report(run, wrong, ref.grads, flips)
    row = report["features.0.0.kernel"]
    assert not row.report.passed  # the per-layer tolerance catches the audit's error ...
    assert row.passed and row.explained_by_flips  # ... and the rerun explains it
    assert row.flips == "flips: 3 at features.1.2"
    text = str(report)
    assert "flips: 3 at features.1.2" in text and "FAIL" not in text
    assert "differing from the reference: 3 at features.1.2 (relu)" in text
    # Rows of layers that ran after the flip are not reached by it.
    assert report["classifier.0.kernel"].flips == ""
    again = LayerwiseReport.from_dict(json.loads(report.to_json()))
    assert again["features.0.0.kernel"].flips == row.flips and again.passed


def test_error_the_flips_do_not_explain_fails(run):
    model, _, _, ref = run
    flips = [FlipSite("features.1.2", "relu", 3, _site_after(ref.done, "features.1.2"))]
    wrong = _with_error(ref.grads, "features.layers.0.layers.0.kernel")
    # Still off with the decisions pinned: not the flips' doing.
    report = _report(run, wrong, wrong, flips)
    assert not report.passed
    assert "FAIL (1 with decisions pinned; flips: 3 at features.1.2)" in str(report)
    # An error in a layer after every flip fails as a plain failure.
    late = _with_error(ref.grads, "classifier.layers.3.kernel")
    report = _report(run, late, late, flips)
    assert not report["classifier.3.kernel"].passed
    assert report["classifier.3.kernel"].flips == ""


def test_pins_make_the_program_follow_the_given_decisions(run):
    model, x, labels, ref = run
    flipped = [d._replace(value=np.array(d.value)) for d in ref.decisions]
    mask = flipped[0].value
    mask.flat[np.flatnonzero(mask)[0]] = False
    layout = model.layout
    _, pins = decision_flips(flipped, ref.decisions, layout, layout)
    pinned = probed_parameter_grads(model, x, labels, train=True, pins=pins)
    flips, _ = decision_flips(flipped, pinned.decisions, layout, layout)
    # The recorded decisions are the program's own (before pinning), so they differ from
    # the modified ones at exactly that element (and, where the zeroed value was a window's
    # maximum, at the max pool behind it) ...
    assert (flips[0].site, flips[0].count) == ("features.0.2", 1)
    assert {f.site for f in flips} <= {"features.0.2", "features.2"}
    # ... while the gradients follow the pinned mask: they moved.
    moved = _report(run, pinned.grads, None, ())
    assert moved.rows and any(r.rel_l2 > 0 for r in moved.rows)
    with probe_decisions(model) as log:
        pass
    assert log.decisions == []


def test_a_repeated_comparison_runs_its_kept_program_and_a_pinned_one_traces(run, monkeypatch):
    from layoutlab.compare import gradients

    model, x, labels, ref = run
    probed_parameter_grads(model, x, labels, train=True)  # kept, if evicted since the fixture
    traces = []
    recording = gradients.record_layers
    monkeypatch.setattr(
        gradients, "record_layers", lambda *a, **k: traces.append(1) or recording(*a, **k)
    )
    again = probed_parameter_grads(model, x, labels, train=True)
    assert traces == []  # read back: nothing traced, so nothing compiled
    assert again.loss == ref.loss and again.order == ref.order
    for a, b in zip(jax.tree.leaves(again.grads), jax.tree.leaves(ref.grads), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # the same program
    _, pins = decision_flips(ref.decisions, ref.decisions)
    for _ in range(2):  # pinned programs are not kept: each call traces its own
        probed_parameter_grads(model, x, labels, train=True, pins=pins)
    assert len(traces) == 2


def _cli(*argv):
    parser = argparse.ArgumentParser(prog="layoutlab")
    command.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["compare", *argv])
    return args.func(args)


@pytest.fixture
def torch_one_thread():
    """torch, running single-threaded: the two cores are shared with XLA, and torch's
    OpenMP pool spin-waits when oversubscribed (as in test_compare_torch.py), and under
    ``-n 2`` both cores are busy; one thread computes the same problem."""
    torch = pytest.importorskip("torch")
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield torch
    torch.set_num_threads(saved)


# The planted element's pre-activation: this far above zero for the candidate and as far
# below for the reference. float32's own error there is a few 1e-7 (values of order 1 after a
# BatchNorm), so the candidate's decision cannot go either way; the nudge moves the
# reference's layer outputs by 4e-5 at one element, inside the forward tolerance.
NUDGE = 2e-5
PLANTED = (0, 0, 3, 3)  # NCHW: sample 0, channel 0, row 3, column 3 of features.0's BatchNorm


def _planted_problem(tmp_path, torch):
    """small_cnn's tiny weights and an input, with channel 0's BatchNorm shift set so the
    planted element's float64 pre-activation is ``+NUDGE``; saved for the CLI."""
    from layoutlab import models
    from layoutlab.compare.torch_reference import torch_mirror_of
    from layoutlab.compare.torch_weights import to_torch_state_dict

    model = fast_model("small_cnn", num_classes=10)
    x = random_input("small_cnn", "NHWC", 4)
    mirror = torch_mirror_of(model, "small_cnn", num_classes=10, **models.spec("small_cnn").tiny)
    seen = []
    hook = mirror.features[0][1].register_forward_hook(lambda m, a, out: seen.append(out))
    with torch.no_grad():
        mirror.double().train()(torch.from_numpy(x.transpose(0, 3, 1, 2).astype(np.float64)))
    hook.remove()
    state = to_torch_state_dict(model, tensors=True)
    # A train-mode BatchNorm's shift does not enter its statistics: only this sum moves.
    state["features.0.1.bias"][0] += NUDGE - float(seen[0][PLANTED])
    weights, inputs = tmp_path / "w.pth", tmp_path / "x.npy"
    torch.save(state, weights)
    np.save(inputs, x)
    return weights, inputs


def _nudged_mirrors(monkeypatch):
    """Every torch mirror the CLI builds gets ``-2 * NUDGE`` added at the planted element of
    features.0's BatchNorm output: a reference whose value there sits on the other side of
    zero, as float64 rounding puts a float32 tie, and whose recorded decision (the ReLU's
    input) and gradients both follow it."""
    from layoutlab.compare import torch_reference

    built = torch_reference.torch_mirror_of

    def nudged(*args, **kwargs):
        mirror = built(*args, **kwargs)

        def shift(m, a, out):
            d = out.new_zeros(out.shape)
            d[PLANTED] = -2 * NUDGE
            return out + d

        mirror.features[0][1].register_forward_hook(shift)
        return mirror

    monkeypatch.setattr(torch_reference, "torch_mirror_of", nudged)


@pytest.mark.torch
def test_cli_names_the_cause_of_every_gradient_row_out_of_tolerance(
    tmp_path, capsys, monkeypatch, torch_one_thread
):
    """``layoutlab compare --against torch --grads --mode train`` with one ReLU decision
    planted on the reference's side (``_nudged_mirrors``): the flip is found at its site,
    it moves rows out of tolerance as run, and every such row is named by the flip and is
    within tolerance on the reference's decisions, so the comparison passes."""
    weights, inputs = _planted_problem(tmp_path, torch_one_thread)
    _nudged_mirrors(monkeypatch)
    out = tmp_path / "r.json"
    code = _cli("--model", "small_cnn", "--tiny", "--against", "torch", "--grads", "--mode",
                "train", "--torch-weights", str(weights), "--input", str(inputs),
                "--json-file", str(out))  # fmt: skip
    grads = json.loads(out.read_text())["grads"]
    assert ["features.0.2", "relu", 1] in grads["decision_flips"]
    out_of_tolerance = [r for r in grads["rows"] if not r["report"]["passed"]]
    assert out_of_tolerance  # the planted flip moved rows: the loop below checks something
    for row in out_of_tolerance:
        assert row["flips"].startswith("flips: ") and row["pinned"]["passed"], row["path"]
        assert "features.0.2" in row["flips"], row["path"]
    assert code == 0 and grads["passed"]
    printed = capsys.readouterr().out
    assert "differing from the reference: " in printed
    # The decisions line tells the same as the flip count under it, and what is left after
    # pinning is float32's own rounding (PyTorch float32 on the pinned case as the yardstick).
    assert "decisions: 1 differ from the reference's at 1 site(s)" in printed, printed
    assert "matched" not in grads["settings"]["decisions"]
    assert grads["settings"]["float32_check"].startswith("within float32's own"), grads


def test_cli_input_of_the_wrong_shape_exits_2(tmp_path, capsys):
    bad = tmp_path / "x.npy"
    np.save(bad, np.zeros((2, 8, 8, 3), np.float32))  # small_cnn takes 1 channel
    code = _cli("--model", "small_cnn", "--tiny", "--against", "layout", "--input", str(bad))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: --input")
