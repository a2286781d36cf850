"""Autotuning: measure, check numerics, pick, cache, hit the cache; and the shape watcher."""

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from layoutlab import models
from layoutlab.bench.tuning import (
    ShapeChurnWarning,
    ShapeWatcher,
    autotune,
    autotune_config,
    cache_key,
    candidate_tolerance,
    parse_candidates,
)

TINY = models.spec("small_cnn").tiny
SHAPE = (8, 8, 1)


def _refuse(case):
    raise AssertionError("measured although the choice was cached")


def test_autotune_measures_picks_caches_and_hits(tmp_path):
    result = autotune(
        "small_cnn", 2, SHAPE, model_kwargs=TINY, mode="infer", repeats=2, warmup=1,
        backend="cpu", cache_dir=tmp_path,
    )  # fmt: skip
    assert not result.from_cache
    assert len(result.candidates) == 4 and all(c["status"] == "ok" for c in result.candidates)
    # Same seed, same weights: every layout/precision agrees with fp32 NHWC within its
    # dtype-scaled tolerance, so all four pass. Two rounds are no evidence (a 95% interval
    # needs six), so the default, NHWC fp32, is kept whichever was fastest.
    assert all(c["numerics_passed"] for c in result.candidates)
    assert (result.layout, result.precision) == ("NHWC", "fp32")
    assert result.evidence["verdict"] in ("tie", "default fastest")
    assert result.evidence["fingerprint"] == result.key["fingerprint"]
    assert [c["chosen"] for c in result.candidates].count(True) == 1
    assert Path(result.cache_path) == tmp_path / "autotune.json"  # cache_dir: the file in it
    data = json.loads(Path(result.cache_path).read_text())
    assert data["format"] == "layoutlab.autotune/2"
    (saved,) = data["entries"].values()
    assert saved["kind"] == "layout"
    assert saved["choice"] == {"layout": result.layout, "precision": result.precision}
    assert saved["key"]["input_shape"] == "8x8x1" and saved["key"]["batch_size"] == 2

    again = autotune(
        "small_cnn", 2, "8x8x1", model_kwargs=TINY, mode="infer", backend="cpu",
        cache_dir=tmp_path, runner=_refuse,
    )  # fmt: skip
    assert again.from_cache and (again.layout, again.precision) == (result.layout, result.precision)
    assert again.cache_path == result.cache_path

    config = autotune_config(
        "small_cnn", 2, SHAPE, model_kwargs=TINY, mode="infer", backend="cpu",
        cache_dir=tmp_path, runner=_refuse,
    )  # fmt: skip
    assert config == (result.layout, result.precision)


class FakeRunner:
    """Timings and logits chosen by the test; ``logits`` per (layout, precision)."""

    def __init__(self, case, ms, logits, calls):
        self.key = (case.layout, case.precision)
        self.ms, self.out, self.calls = ms[self.key], logits[self.key], calls

    def setup(self):
        self.calls.append(self.key)
        return {"compile_s": 0.0}

    def step(self):
        return next(self.ms) if hasattr(self.ms, "__next__") else self.ms

    def logits(self):
        return self.out

    def close(self):
        pass


def test_fastest_candidate_with_broken_numerics_is_skipped(tmp_path):
    ref = np.random.default_rng(0).standard_normal((2, 10)).astype(np.float32)
    ms = {("NHWC", "fp32"): 40.0, ("NCHW", "fp32"): 30.0, ("NHWC", "mixed_bf16"): 1.0}
    logits = {
        ("NHWC", "fp32"): ref,
        ("NCHW", "fp32"): ref + np.float32(1e-7),  # within float32 tolerance
        ("NHWC", "mixed_bf16"): np.full_like(ref, np.nan),  # fastest, but broken
    }
    calls = []
    kwargs = dict(
        model_kwargs=TINY, mode="infer", repeats=8, warmup=0, backend="cpu", cache_dir=tmp_path,
        candidates="NHWC:fp32,NCHW:fp32,NHWC:mixed_bf16",
        runner=lambda case: FakeRunner(case, ms, logits, calls), timer=_synthetic,
    )  # fmt: skip
    result = autotune("small_cnn", 2, SHAPE, **kwargs)
    # 30 against 40 ms in every round: clearly faster, so it replaces the default.
    assert (result.layout, result.precision) == ("NCHW", "fp32")
    assert result.evidence["verdict"] == "faster"
    assert result.evidence["ratio"] == pytest.approx([40 / 30] * 3)
    passed = {(c["layout"], c["precision"]): c["numerics_passed"] for c in result.candidates}
    assert passed == {("NHWC", "fp32"): True, ("NCHW", "fp32"): True,
                      ("NHWC", "mixed_bf16"): False}  # fmt: skip
    assert len(calls) == 3
    # force=True searches again instead of reading the cache.
    autotune("small_cnn", 2, SHAPE, force=True, **kwargs)
    assert len(calls) == 6


def _synthetic(step):
    """The injected timer: the fake step returns its own milliseconds."""
    return step() / 1e3


def test_noise_makes_a_tie_and_keeps_the_default(tmp_path):
    rng = np.random.default_rng(3)
    ref = rng.standard_normal((2, 10)).astype(np.float32)
    # NCHW's median is a little lower, but the rounds swing by +-50%: no separation.
    ms = {
        ("NHWC", "fp32"): iter(40 * rng.uniform(0.5, 1.5, 100)),
        ("NCHW", "fp32"): iter(38 * rng.uniform(0.5, 1.5, 100)),
    }
    logits = {k: ref for k in ms}
    result = autotune(
        "small_cnn", 2, SHAPE, model_kwargs=TINY, mode="infer", repeats=12, warmup=0,
        backend="cpu", cache_dir=tmp_path, candidates="NHWC:fp32,NCHW:fp32",
        runner=lambda case: FakeRunner(case, ms, logits, []), timer=_synthetic,
    )  # fmt: skip
    evidence = result.evidence
    assert (result.layout, result.precision) == ("NHWC", "fp32")
    assert evidence["verdict"] in ("tie", "default fastest")
    if evidence["verdict"] == "tie":
        assert evidence["ratio"][1] <= 1.0  # the interval's low end: not above parity
    saved = json.loads((tmp_path / "autotune.json").read_text())
    (entry,) = saved["entries"].values()
    assert entry["evidence"]["verdict"] == evidence["verdict"]
    assert all(len(c["round_ms"]) == 12 for c in entry["candidates"])


def test_a_new_machine_fingerprint_tunes_again(tmp_path, monkeypatch):
    import layoutlab.bench.tuning.layout as layout_tuning

    ref = np.zeros((2, 10), np.float32)
    ms = {("NHWC", "fp32"): 10.0, ("NCHW", "fp32"): 20.0}
    calls = []
    kwargs = dict(
        model_kwargs=TINY, mode="infer", repeats=6, warmup=0, backend="cpu", cache_dir=tmp_path,
        candidates="NHWC:fp32,NCHW:fp32", timer=_synthetic,
        runner=lambda case: FakeRunner(case, ms, {k: ref for k in ms}, calls),
    )  # fmt: skip
    autotune("small_cnn", 2, SHAPE, **kwargs)
    autotune("small_cnn", 2, SHAPE, **kwargs)  # same machine: from the cache
    assert len(calls) == 2
    monkeypatch.setattr(layout_tuning, "machine_fingerprint", lambda: "another CPU|cores=64|")
    again = autotune("small_cnn", 2, SHAPE, **kwargs)
    assert not again.from_cache and len(calls) == 4
    assert again.key["fingerprint"] == "another CPU|cores=64|"


def test_cache_key_changes_with_shape_batch_and_options():
    base = cache_key("small_cnn", 2, (8, 8, 1), model_kwargs=TINY, backend="cpu")
    assert base == cache_key("small_cnn", 2, "8x8x1", model_kwargs=TINY, backend="cpu")
    others = [
        cache_key("small_cnn", 2, (16, 16, 1), model_kwargs=TINY, backend="cpu"),
        cache_key("small_cnn", 4, (8, 8, 1), model_kwargs=TINY, backend="cpu"),
        cache_key("small_cnn", 2, (8, 8, 1), model_kwargs={"width": 8}, backend="cpu"),
        cache_key("small_cnn", 2, (8, 8, 1), model_kwargs=TINY, mode="infer", backend="cpu"),
    ]
    assert all(o != base for o in others)
    for field in ("backend", "device_kind", "versions", "input_dtype", "fingerprint"):
        assert field in base
    assert set(base["versions"]) == {"jax", "jaxlib", "flax"}


def test_tolerance_scales_with_compute_dtype_and_depth():
    ref = np.array([[4.0, -2.0]], np.float32)
    fp32 = candidate_tolerance("fp32", 9, ref)
    bf16 = candidate_tolerance("mixed_bf16", 9, ref)
    # float32's default rtol is 1.3e-6 and bfloat16's 1.6e-2 (torch.testing's table),
    # times sqrt(9 weight layers) = 3; atol is rtol times the largest |logit| (4).
    assert fp32.rtol == pytest.approx(3 * 1.3e-6) and fp32.atol == pytest.approx(4 * 3 * 1.3e-6)
    assert bf16.rtol == pytest.approx(3 * 1.6e-2) and bf16.atol == pytest.approx(4 * 3 * 1.6e-2)
    # On GPU float32 convs run in TF32 by default: float16's rtol (1e-3) applies.
    assert candidate_tolerance("fp32", 9, ref, "gpu").rtol == pytest.approx(3 * 1e-3)


def test_bad_candidates_and_shapes_are_clear_errors():
    with pytest.raises(ValueError, match="LAYOUT:PRECISION"):
        parse_candidates("NHWC-fp32")
    with pytest.raises(ValueError, match="Unknown precision policy"):
        parse_candidates("NHWC:fp8")
    with pytest.raises(ValueError, match="HxWxC"):
        cache_key("small_cnn", 2, "8by8")
    with pytest.raises(ValueError, match="2 spatial sizes and a channel count"):
        cache_key("small_cnn", 2, "8x8")


def test_shape_watcher_warns_once_when_shapes_keep_changing():
    watcher = ShapeWatcher(max_shapes=2)
    assert watcher.observe((32, 8, 8, 1)) is True
    assert watcher.observe((32, 8, 8, 1)) is False
    assert watcher.observe(np.zeros((7, 8, 8, 1))) is True  # a last partial batch is normal
    with pytest.warns(ShapeChurnWarning, match="3 different input shapes"):
        watcher.observe((16, 8, 8, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert watcher.observe((8, 8, 8, 1)) is True  # warned already: silent
    with pytest.raises(ValueError):
        ShapeWatcher(max_shapes=0)
