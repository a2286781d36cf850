"""``onednn`` is an autotuner candidate on CPU where its extension loaded, for float32 and
bfloat16 compute alike, and is skipped, not failed, where it did not (availability is
monkeypatched; the algorithm is a stand-in running XLA's conv, registered for the test and
put back after, so this holds whether or not this machine has the real one)."""

import types

import pytest

from layoutlab.bench import tuning as cat
from layoutlab.nn import conv_algos as ca
from layoutlab.nn.conv_algos import onednn_status, registry
from layoutlab.nn.conv_algos.native import native_conv, supports_all


def _spec(dtype):
    return ca.conv_spec((2, 6, 6, 3), (3, 3, 3, 4), strides=1, padding=1, dtype=dtype)


@pytest.fixture
def onednn(monkeypatch):
    """A stand-in ``onednn``; ``set(available)`` says whether its extension loaded."""
    before = registry._registry().get("onednn")
    stand_in = registry.Algorithm("onednn", native_conv, supports_all, "stand-in")
    registry.register_algorithm(stand_in, replace=True)

    def set_available(available: bool):
        module = types.SimpleNamespace(
            available=lambda: available,
            unavailable_reason=lambda: None if available else "simulated: not built",
            status_line=lambda: "onednn convs: oneDNN 3.2.0" if available else "unavailable",
        )
        monkeypatch.setattr(onednn_status, "_load", lambda: module)

    yield set_available
    if before is None:
        registry.unregister_algorithm("onednn")
    else:
        registry.register_algorithm(before, replace=True)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("objective", ["train", "inference"])
def test_onednn_is_a_cpu_candidate_only_where_available(onednn, dtype, objective):
    spec = _spec(dtype)
    onednn(True)
    assert "onednn" in cat.candidates_for(spec, objective=objective, platform="cpu")
    assert "onednn" not in cat.candidates_for(spec, objective=objective, platform="gpu")
    onednn(False)
    names = cat.candidates_for(spec, ["xla", "onednn"], objective, platform="cpu")
    assert names == ["xla"]


def test_an_unavailable_onednn_is_skipped_by_the_tuner(onednn, tmp_path):
    spec = _spec("float32")
    onednn(False)
    result = cat.autotune_conv(
        spec, algorithms=["xla", "onednn"], cache=tmp_path / "a.json", repeats=1, warmup=0
    )
    # Only xla is left: chosen without measuring anything, and nothing failed.
    assert result.choice == "xla" and result.candidates == []
    onednn(True)
    result = cat.autotune_conv(
        spec, algorithms=["xla", "onednn"], cache=tmp_path / "a.json", repeats=1, warmup=0
    )
    # Another candidate set is another cache key: measured, onednn checked and timed.
    assert not result.from_cache
    assert [c.algorithm for c in result.candidates] == ["xla", "onednn"]
    assert all(c.passed and c.train_ms is not None for c in result.candidates)
