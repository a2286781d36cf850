"""``onednn`` and ``onednn_xla_dw`` are autotuner candidates on CPU where the extension
loaded, for float32 and bfloat16 compute alike, and are skipped, not failed, where it did not
(availability is monkeypatched; the algorithms are stand-ins running XLA's conv, registered
for the test and put back after, so this holds whether or not this machine has the real
ones)."""

import types

import pytest

from layoutlab.bench import tuning as cat
from layoutlab.nn import conv_algos as ca
from layoutlab.nn.conv_algos import onednn_status, registry
from layoutlab.nn.conv_algos.native import native_conv, supports_all

ONEDNN_NAMES = ("onednn", "onednn_xla_dw")


def _spec(dtype):
    return ca.conv_spec((2, 6, 6, 3), (3, 3, 3, 4), strides=1, padding=1, dtype=dtype)


@pytest.fixture
def onednn(monkeypatch):
    """Stand-ins for ``onednn`` and ``onednn_xla_dw``; ``set(available)`` says whether their
    extension loaded."""
    before = {name: registry._registry().get(name) for name in ONEDNN_NAMES}
    for name in ONEDNN_NAMES:
        stand_in = registry.Algorithm(name, native_conv, supports_all, "stand-in")
        registry.register_algorithm(stand_in, replace=True)

    def set_available(available: bool):
        module = types.SimpleNamespace(
            available=lambda: available,
            unavailable_reason=lambda: None if available else "simulated: not built",
            status_line=lambda: "onednn convs: oneDNN 3.2.0" if available else "unavailable",
            wait_policy=lambda: "PASSIVE (set by layoutlab)",
        )
        monkeypatch.setattr(onednn_status, "_load", lambda: module)

    yield set_available
    for name, algorithm in before.items():
        if algorithm is None:
            registry.unregister_algorithm(name)
        else:
            registry.register_algorithm(algorithm, replace=True)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("objective", ["train", "inference"])
def test_onednn_is_a_cpu_candidate_only_where_available(onednn, dtype, objective):
    spec = _spec(dtype)
    onednn(True)
    on_cpu = cat.candidates_for(spec, objective=objective, platform="cpu")
    on_gpu = cat.candidates_for(spec, objective=objective, platform="gpu")
    assert set(ONEDNN_NAMES) <= set(on_cpu) and not set(ONEDNN_NAMES) & set(on_gpu)
    onednn(False)
    names = cat.candidates_for(spec, ["xla", *ONEDNN_NAMES], objective, platform="cpu")
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
