"""The conv plan as a value: JSON round trip, coverage counting, bad input; the program a
model traces depends on its plan and on nothing else in the process (the autotune cache
included); the old autotune spellings still work and warn."""

import json

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from layoutlab import cli, models, nn
from layoutlab.bench import tuning as at
from layoutlab.nn.conv_algos import ConvPlan, PlanEntry, algorithm_values, load_plan
from layoutlab.nn.conv_config import (
    conv_specs,
    default_conv_plan,
    missing_from_plan,
    plan_coverage,
    planned_entries,
    running_algorithms,
    table_made,
)

KWARGS = dict(models.spec("small_cnn").tiny)
X = jax.ShapeDtypeStruct((2, 8, 8, 1), jnp.float32)


def _model():
    # Abstract: only shapes matter to tracing, and eager init would compile many small ops.
    model = nnx.eval_shape(lambda: models.create("small_cnn", rngs=nnx.Rngs(0), **KWARGS))
    return nn.configure(model, nn.ConvSettings.named("auto"))


def with_conv_plan(model, plan):
    return nn.configure(model, plan, algorithms=algorithm_values(plan.algorithms().values()))


def _hlo(model) -> str:
    graphdef, state = nnx.split(model)

    @jax.jit
    def forward(st, x):
        return nnx.merge(graphdef, st)(x)

    return forward.lower(state, X).as_text()


def _plan(specs, algorithm="im2col", **evidence):
    return ConvPlan(
        {p: (algorithm, s.key()) for p, s in specs.items()},
        {p: evidence for p in specs} if evidence else None,
    )


def test_plan_round_trips_compares_and_is_immutable(tmp_path):
    specs = conv_specs(_model(), X)
    plan = _plan(specs, times_ms={"xla": [1.0, 2.5], "im2col": [0.5, 1.5]}, source="measured")
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["format"] == "layoutlab.conv_plan/1" and len(data["convs"]) == 3
    again = ConvPlan.from_dict(data)
    assert again == plan and hash(again) == hash(plan)
    assert load_plan(plan.save(tmp_path / "p.json")) == plan
    assert plan.evidence(next(iter(plan)))["times_ms"]["xla"] == (1.0, 2.5)
    assert plan != _plan(specs, algorithm="xla")
    assert plan != _plan(specs)  # same entries, other evidence
    assert hash(_plan(specs)) == hash(plan)  # the hash covers the entries only
    with pytest.raises(AttributeError, match="immutable"):
        plan.entries = {}
    with pytest.raises(TypeError):
        plan.evidence(next(iter(plan)))["source"] = "edited"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"convs": {"c": {"algorithm": "fft", "spec_key": "k"}}}, "Unknown conv algorithm 'fft'"),
        ({"convs": {"c": {"algorithm": "auto", "spec_key": "k"}}}, "says 'auto'"),
        ({"convs": {"c": {"algorithm": "im2col"}}}, "needs string 'algorithm' and 'spec_key'"),
        ({"convs": {"c": "im2col"}}, "entry 'c' is not a mapping"),
        ({"c": "im2col"}, "a mapping with a 'convs' mapping"),
        ([1, 2], "a mapping with a 'convs' mapping"),
        ({"format": "layoutlab.conv_plan/0", "convs": {}}, "format 'layoutlab.conv_plan/0'"),
    ],
)
def test_bad_plans_are_value_errors_naming_the_fix(data, message):
    with pytest.raises(ValueError, match=message):
        ConvPlan.from_dict(data)


def test_malformed_plan_files(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json is not valid JSON"):
        load_plan(bad)
    with pytest.raises(ValueError, match="No conv plan at"):
        load_plan(tmp_path / "none.json")


def test_missing_entries_are_counted():
    model = _model()
    specs = conv_specs(model, X)
    assert plan_coverage(model, X) == (3, 3)
    first, *rest = specs
    partial = with_conv_plan(model, ConvPlan({first: ("im2col", specs[first].key())}))
    assert planned_entries(partial) == {first: PlanEntry("im2col", specs[first].key())}
    assert set(missing_from_plan(partial, X)) == set(rest)
    # An entry chosen for another shape counts as missing too (it runs xla).
    wrong = with_conv_plan(model, ConvPlan({first: ("im2col", specs[rest[0]].key())}))
    assert plan_coverage(wrong, X) == (3, 3)
    # Only "auto" convs follow a plan, so only they are counted.
    assert plan_coverage(nn.configure(partial, nn.ConvSettings()), X) == (0, 0)
    with pytest.raises(ValueError, match="does not have \\(nope\\)"):
        with_conv_plan(model, ConvPlan({"nope": ("im2col", "k")}))
    # What runs: the entry's algorithm for its own shape, xla for another shape or none.
    assert running_algorithms(partial, X) == {first: "im2col", **dict.fromkeys(rest, "xla")}
    assert running_algorithms(wrong, specs=specs) == dict.fromkeys(specs, "xla")
    assert running_algorithms(nn.configure(partial, nn.ConvSettings.named("im2col")), X) == (
        dict.fromkeys(specs, "im2col")
    )
    # A table-made plan is told apart from one with any measured or given entry.
    table = default_conv_plan(model, X, "inference", "avx2", specs)
    assert table_made(table) and table_made(table.to_dict())
    assert not table_made(_plan(specs, source="measured")) and not table_made(ConvPlan())


def test_the_program_follows_the_plan_not_the_autotune_cache(tmp_path, monkeypatch):
    model = _model()
    specs = conv_specs(model, X)
    cache = tmp_path / "autotune.json"
    tuned = at.autotune_model(model, X, algorithms=["xla"], cache=cache, repeats=1, warmup=0)
    assert tuned.plan.algorithms() == dict.fromkeys(specs, "xla")
    planned = with_conv_plan(model, tuned.plan)
    before = _hlo(planned)
    assert "convolution" in before

    # Other autotune results land in the cache between the two traces...
    again = at.autotune_model(
        model, X, algorithms=["xla", "im2col"], cache=cache, repeats=1, warmup=0
    )
    assert len(json.loads(cache.read_text())["entries"]) == 2 * len(specs)
    # ...and the same model (same plan) traces to the same program.
    assert _hlo(planned) == before
    assert _hlo(with_conv_plan(model, ConvPlan.from_dict(tuned.plan.to_dict()))) == before
    # A changed plan is a changed program (and graph definition, so jit retraces).
    changed = with_conv_plan(model, _plan(specs, "im2col"))
    assert nnx.graphdef(changed) != nnx.graphdef(planned)
    after = _hlo(changed)
    assert after != before and "convolution" not in after
    # The new tuning's plan gives a different program only where its choices differ.
    same = again.plan.algorithms() == tuned.plan.algorithms()
    assert (_hlo(with_conv_plan(model, again.plan)) == before) == same


def test_old_autotune_spellings_still_work_and_warn(tmp_path, capsys):
    argv = ["autotune", "--model", "small_cnn", "--tiny", "--batch-size", "2",
            "--input-shape", "8x8x1", "--candidates", "NHWC:fp32", "--mode", "infer",
            "--repeats", "1", "--warmup", "0", "--backend", "cpu",
            "--cache-dir", str(tmp_path)]  # fmt: skip
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    # One candidate: it is the default and the fastest.
    assert out.startswith("NHWC fp32 (default fastest; measured; ")
    assert str(tmp_path / "autotune.json") in out
    assert "warning: `layoutlab autotune --model ...` is deprecated" in err
    assert "warning: `autotune --cache-dir DIR` is deprecated" in err
    assert "warning: --input-shape is deprecated" in err and "--image-size HxW --channels" in err
    new = ["autotune", "layout", *argv[1:6], "--image-size", "8", "--channels", "1",
           *argv[8:-2], "--cache", str(tmp_path / "autotune.json")]  # fmt: skip
    assert cli.main(new) == 0
    out, err = capsys.readouterr()
    assert out.startswith("NHWC fp32 (default fastest; cache; ") and "warning" not in err
    # Bad input through the alias is still a one-line error, exit 2.
    assert cli.main(["conv-autotune", "--model", "small_cnn", "--batch-size", "0"]) == 2
    err = capsys.readouterr().err
    assert "deprecated" in err and "error: batch_size must be a positive int" in err
