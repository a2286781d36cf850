"""Per-shape conv algorithm autotuning: references, tolerance filter, cache, the conv plan."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from layoutlab import nn
from layoutlab.bench import tuning as cat
from layoutlab.bench.tuning import convs as tune_convs
from layoutlab.bench.tuning.cache import CACHE_ENV
from layoutlab.bench.tuning.conv_reference import spec_inputs
from layoutlab.nn import conv_algos as ca
from layoutlab.nn.conv_algos.algorithm import plain_2d
from layoutlab.nn.conv_algos.native import native_conv
from layoutlab.nn.conv_config import conv_settings, missing_from_plan, model_conv_specs

TINY = dict(strides=1, padding=1, layout="NHWC", dtype="float32")


def _tiny_spec(**kw):
    args = {**TINY, **kw}
    shape = (2, 6, 6, 3) if args["layout"] == "NHWC" else (2, 3, 6, 6)
    kernel = (3, 3, 3, 4) if args["layout"] == "NHWC" else (4, 3, 3, 3)
    return ca.conv_spec(shape, kernel, **args)


@pytest.mark.torch
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize(("stride", "padding"), [(1, "SAME"), (2, "SAME"), (2, 1)])
def test_reference_gradients_match_torch_float64_autograd(layout, stride, padding):
    """The NumPy gradient formulas (transposed conv, conv with dilated dy) against torch."""
    torch = pytest.importorskip("torch")
    xs, ws = ((2, 7, 8, 3), (3, 3, 3, 4)) if layout == "NHWC" else ((2, 3, 7, 8), (4, 3, 3, 3))
    spec = ca.conv_spec(xs, ws, strides=stride, padding=padding, layout=layout)
    x, w, dy = spec_inputs(spec, seed=5)
    refs = cat.reference_conv(x, w, dy, spec)
    to_cf = (lambda a: np.transpose(a, (0, 3, 1, 2))) if layout == "NHWC" else (lambda a: a)
    w_oihw = np.transpose(w, (3, 2, 0, 1)) if layout == "NHWC" else w
    (pl, ph), (ql, qh) = spec.geometry.padding
    tx = torch.tensor(to_cf(x), dtype=torch.float64, requires_grad=True)
    tw = torch.tensor(w_oihw, dtype=torch.float64, requires_grad=True)
    y = torch.nn.functional.conv2d(torch.nn.functional.pad(tx, (ql, qh, pl, ph)), tw, stride=stride)
    y.backward(torch.tensor(to_cf(dy), dtype=torch.float64))
    # float64 on both sides, sums of at most a few hundred terms: agreement to ~1e-12.
    np.testing.assert_allclose(to_cf(refs["y"]), y.detach().numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(to_cf(refs["dx"]), tx.grad.numpy(), rtol=1e-10, atol=1e-10)
    dw = np.transpose(refs["dw"], (3, 2, 0, 1)) if layout == "NHWC" else refs["dw"]
    np.testing.assert_allclose(dw, tw.grad.numpy(), rtol=1e-10, atol=1e-10)


def test_conv_tolerance_formula():
    # u(float32) * (1 + sqrt(K)) and u(bfloat16) + u(float32) * sqrt(K)
    assert cat.conv_tolerance(jnp.float32, 576).rtol == pytest.approx(1.3e-6 * 25)
    assert cat.conv_tolerance(jnp.bfloat16, 100).rtol == pytest.approx(1.6e-2 + 1.3e-5)
    with pytest.raises(ValueError, match="reduction"):
        cat.conv_tolerance(jnp.float32, 0)


def test_autotune_picks_a_passing_candidate_caches_and_reloads(tmp_path, monkeypatch):
    path = tmp_path / "conv.json"
    spec = _tiny_spec()
    every = cat.candidates_for(spec)
    assert every[0] == "xla" and {"im2col", "gemm_dw", "winograd2", "winograd4"} <= set(every)
    assert "pointwise" not in every and "s2d" not in every  # 1x1 / stride-2 only
    # In inference an algorithm whose forward is XLA's conv would time the same program.
    forward = cat.candidates_for(spec, objective="inference")
    twins = {"gemm_dw", "col2im_dx", "phase_dx"}
    assert twins <= set(every) and not twins & set(forward)
    assert forward == [n for n in every if n not in twins]
    result = cat.autotune_conv(
        spec, algorithms=["xla", "im2col", "winograd2"], cache=path, repeats=1, warmup=0
    )
    assert [c.algorithm for c in result.candidates] == ["xla", "im2col", "winograd2"]
    chosen = next(c for c in result.candidates if c.algorithm == result.choice)
    assert chosen.passed and chosen.train_ms is not None
    passing = [c for c in result.candidates if c.passed]
    # One round is no evidence (a 95% interval of the paired ratio needs six): xla stays,
    # as a tie unless it was the fastest anyway.
    assert result.choice == "xla"
    fastest = min(passing, key=lambda c: c.train_ms).algorithm
    assert result.verdict == ("default fastest" if fastest == "xla" else "tie")
    assert set(result.rounds_ms) == {c.algorithm for c in passing}
    assert result.fingerprint and result.fingerprint in result.cache_key  # another machine:
    # another key, so measured again
    print(result.table())

    data = json.loads(path.read_text())
    (entry,) = data["entries"].values()
    assert entry["spec_key"] == spec.key() and entry["versions"]["jax"] == jax.__version__
    assert entry["device_kind"] == jax.devices()[0].device_kind

    # Same key again: served from the cache, nothing measured.
    monkeypatch.setattr(
        tune_convs, "time_candidate_rounds", lambda *a, **k: pytest.fail("re-measured")
    )
    again = cat.autotune_conv(
        spec, algorithms=["xla", "im2col", "winograd2"], cache=path, repeats=1, warmup=0
    )
    assert again.from_cache and again.choice == result.choice
    # Another objective is another key: measured anew, beside the first entry.
    monkeypatch.undo()
    cat.autotune_conv(spec, algorithms=["xla"], cache=path, objective="inference", repeats=1)
    kinds = [e["objective"] for e in json.loads(path.read_text())["entries"].values()]
    assert sorted(kinds) == ["inference", "train"]


def _broken_core(x, w, geom, preferred):
    # A plausible bug: the kernel applied flipped (convolution instead of correlation).
    return native_conv(x, w[::-1, ::-1], geom, preferred)


def _zeros_core(x, w, geom, preferred):
    # Wrong but as fast as it gets: a timing-only choice would pick it.
    n, (h, wd), o = x.shape[0], geom.out_size(x.shape[1:3]), w.shape[-1]
    return jnp.zeros((n, h, wd, o), preferred or x.dtype) + 0.0 * jnp.sum(x) * jnp.sum(w)


@pytest.fixture
def planted():
    ca.register_algorithm(ca.Algorithm("test_flipped", _broken_core, plain_2d, ""))
    ca.register_algorithm(ca.Algorithm("test_zeros", _zeros_core, plain_2d, ""))
    yield
    ca.unregister_algorithm("test_flipped")
    ca.unregister_algorithm("test_zeros")


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_planted_wrong_candidates_are_rejected(tmp_path, planted, layout):
    spec = _tiny_spec(layout=layout)
    result = cat.autotune_conv(
        spec,
        algorithms=["xla", "test_flipped", "test_zeros"],
        cache=tmp_path / "c.json",
        repeats=1,
        warmup=0,
    )
    by_name = {c.algorithm: c for c in result.candidates}
    assert by_name["xla"].passed
    for bad in ("test_flipped", "test_zeros"):
        assert by_name[bad].ran and not by_name[bad].passed
        assert "numerics" in by_name[bad].error
        assert by_name[bad].train_ms is None  # never timed
    assert result.choice == "xla"


def test_cache_keys_separate_dtype_layout_and_candidates(tmp_path):
    path = tmp_path / "c.json"
    cache = cat.AutotuneCache(path)
    for spec in (_tiny_spec(), _tiny_spec(dtype="bfloat16"), _tiny_spec(layout="NCHW")):
        cat.autotune_conv(spec, algorithms=["xla", "im2col"], cache=cache, repeats=1, warmup=0)
    cat.autotune_conv(_tiny_spec(), algorithms=["xla"], cache=cache, repeats=1, warmup=0)
    assert len(json.loads(path.read_text())["entries"]) == 4


def test_the_work_size_is_part_of_the_key(tmp_path):
    """A choice measured at one batch size is not reused at another: the batch, like the
    spatial size and channels, is in the cache key."""
    path = tmp_path / "c.json"
    spec = _tiny_spec()
    tuned = cat.autotune_conv(spec, algorithms=["xla", "im2col"], cache=path, repeats=1, warmup=0)
    assert ":n2:" in tuned.spec_key and ":n2:" in tuned.cache_key
    for other in (spec._replace(batch=1), spec._replace(batch=128)):
        got = cat.autotune_conv(other, algorithms=["xla", "im2col"], cache=path, cached_only=True)
        assert got is None, other.batch
    again = cat.autotune_conv(spec, algorithms=["xla", "im2col"], cache=path, cached_only=True)
    assert again is not None and again.from_cache and again.choice == tuned.choice


def test_compiler_options_are_part_of_the_key(tmp_path):
    path = tmp_path / "c.json"
    # An empty YNN fusion list makes XLA:CPU run convs with its Eigen kernels instead.
    eigen = {"xla_cpu_experimental_ynn_fusion_type": ""}
    spec = _tiny_spec()
    result = cat.autotune_conv(
        spec,
        algorithms=["xla", "im2col"],
        cache=path,
        repeats=1,
        warmup=0,
        compiler_options=eigen,
    )
    assert result.compiler_options == eigen and all(c.passed for c in result.candidates)
    plain = cat.autotune_conv(spec, algorithms=["xla", "im2col"], cache=path, repeats=1, warmup=0)
    assert not plain.from_cache  # default options: another key
    assert len(json.loads(path.read_text())["entries"]) == 2


def test_autotune_model_returns_a_plan_and_leaves_the_model_alone(tmp_path):
    rngs = nnx.Rngs(0)
    model = nn.Conv(3, 4, 3, rngs=rngs)
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 6, 6, 3)), jnp.float32)
    ref = np.asarray(model(x))
    specs = model_conv_specs(model, x)
    assert [s.key() for s in specs] == [_tiny_spec().key()]
    tuning = cat.autotune_model(
        model, x, algorithms=["xla", "im2col"], cache=tmp_path / "m.json", repeats=1, warmup=0
    )
    assert conv_settings(model) == {"": ("xla", "HWIO")}  # unchanged
    assert tuning.plan.algorithms() == {"": tuning.results[0].choice}
    assert tuning.plan[""].spec_key == specs[0].key()
    evidence = tuning.plan.evidence("")
    assert evidence["source"] == "measured" and evidence["objective"] == "train"
    assert set(evidence["times_ms"]) == {"xla", "im2col"}
    auto = nn.configure(model, nn.ConvSettings.named("auto"))
    assert list(missing_from_plan(auto, x)) == [""]
    values = ca.algorithm_values(tuning.plan.algorithms().values())
    planned = nn.configure(auto, tuning.plan, algorithms=values)
    assert missing_from_plan(planned, x) == {}
    # float32 bar for K = 3*3*3 products (conv_tolerance).
    tol = cat.conv_tolerance(jnp.float32, 27).rtol
    np.testing.assert_allclose(np.asarray(planned(x)), ref, rtol=tol, atol=tol * np.abs(ref).max())


def test_malformed_cache_files_raise(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"entries": {}}))
    with pytest.raises(ValueError, match="not an autotune cache"):
        cat.AutotuneCache(bad)
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        cat.AutotuneCache(bad)
    with pytest.raises(ValueError, match="objective"):
        cat.autotune_conv(_tiny_spec(), objective="fastest", cache=tmp_path / "x.json")


def test_default_cache_path_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "tuned.json"))
    assert cat.default_cache_path() == tmp_path / "tuned.json"
    assert cat.AutotuneCache().path == tmp_path / "tuned.json"
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))  # a directory holds autotune.json
    assert cat.default_cache_path() == tmp_path / "autotune.json"


def test_convs_only_xla_takes_are_planned_without_measuring(tmp_path):
    """A grouped conv that is not depthwise has no other candidate among these (``onednn``,
    where it loads, takes grouped convs): tuning a model with one gives it ``xla`` and says
    why, instead of failing the whole run."""
    grouped = ca.conv_spec((2, 6, 6, 4), (3, 3, 2, 4), groups=2, **TINY)
    algorithms = ["xla", "im2col", "depthwise"]
    results = cat.autotune_convs(
        [grouped, _tiny_spec()], algorithms=algorithms,
        cache=tmp_path / "c.json", repeats=1, warmup=0,
    )  # fmt: skip
    alone = results[0]
    assert (alone.choice, alone.candidates, alone.rounds_ms) == ("xla", [], {})
    assert alone.verdict.startswith("only xla takes this conv: ") and "groups=2" in alone.verdict
    assert results[1].candidates and results[1].spec_key == _tiny_spec().key()
    again = cat.autotune_convs([grouped], algorithms=algorithms, cache=tmp_path / "c.json")
    assert again[0].from_cache and again[0].choice == "xla"


def test_a_depthwise_conv_is_checked_against_float64_and_measured(tmp_path):
    """A depthwise conv (MobileNetV2's) has a candidate besides XLA's: the shifted
    multiply-adds, checked against the grouped float64 reference before it is timed."""
    depthwise = ca.conv_spec((2, 6, 6, 4), (3, 3, 1, 4), groups=4, **TINY)
    (result,) = cat.autotune_convs(
        [depthwise], algorithms=["xla", "depthwise"], cache=tmp_path / "c.json", repeats=2,
        warmup=0,
    )  # fmt: skip
    checked = {c.algorithm: c for c in result.candidates}
    assert set(checked) == {"xla", "depthwise"}
    assert all(c.passed for c in checked.values()), result.candidates
    assert set(result.rounds_ms) == {"xla", "depthwise"}
