"""``layoutlab export`` writes an artifact that loads without layoutlab, whatever convs the run
planned: an algorithm that calls kernels outside XLA (``onednn``) runs XLA's conv there.

The run's convs are forced onto a stand-in ``onednn`` whose core is a custom call to
``layoutlab_onednn_conv_fwd``, so this holds on a machine where oneDNN is unavailable (where
the real algorithm would already run XLA's convs). The target is never registered: export
only lowers, and the lowered program of the run itself is checked to hold the call.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from layoutlab import cli
from layoutlab.infer.export import layoutlab_targets
from layoutlab.infer.load import open_run
from layoutlab.nn.configuration import without_custom_calls
from layoutlab.nn.conv_algos import registry
from layoutlab.nn.conv_algos.native import native_conv, supports_all
from layoutlab.train.steps import make_forward

TARGET = "layoutlab_onednn_conv_fwd"


def _foreign_core(x, w, geometry, preferred):
    out = jax.eval_shape(lambda x, w: native_conv(x, w, geometry, preferred), x, w)
    return jax.ffi.ffi_call(TARGET, out)(x, w)


@pytest.fixture(params=[True, False], ids=["declared", "undeclared"])
def onednn_run(request, copy):
    """The copied tiny run, its config naming a stand-in ``onednn`` for every conv."""
    before = registry._registry().get("onednn")
    registry.register_algorithm(
        registry.Algorithm(
            "onednn", _foreign_core, supports_all, "stand-in", custom_calls=request.param
        ),
        replace=True,
    )
    config = json.loads((copy / "config.json").read_text())
    config["conv_algorithm"] = "onednn"
    (copy / "config.json").write_text(json.dumps(config))
    yield copy, request.param
    if before is None:
        registry.unregister_algorithm("onednn")
    else:
        registry.register_algorithm(before, replace=True)


def test_export_runs_xla_convs_where_the_run_calls_onednn(onednn_run, tmp_path, capsys):
    workdir, declared = onednn_run
    run = open_run(workdir)
    images = jnp.asarray(run.dataset.test_images[:2], jnp.float32)
    own = jax.jit(make_forward(run.inference_defs(images))).lower(run.state(), images)
    assert TARGET in own.as_text(), "the stand-in did not reach the run's own forward"

    out = tmp_path / "m.jax"
    code = cli.main(["export", "--workdir", str(workdir), "--out", str(out), "--batch-size", "2"])
    _, err = capsys.readouterr()
    if not declared:
        # An algorithm that calls its own kernels without saying so: refused in one line.
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
        assert TARGET in lines[0] and "Algorithm.custom_calls" in lines[0], err
        assert not out.exists()
        return
    assert code == 0, err
    exported = jax.export.deserialize(out.read_bytes())
    assert not layoutlab_targets(exported.mlir_module())
    assert "custom_call" not in exported.mlir_module()
    # The artifact computes the run's model: with XLA's convs, the run's own XLA-conv forward.
    xla_defs = without_custom_calls(run.model())
    want = np.asarray(xla_defs(images))
    # Same float32 model, convs by XLA in both; only fusion may differ (1e-5 of the largest).
    got = np.asarray(exported.call(images))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_a_model_without_custom_calls_is_returned_as_is(copy):
    # XLA's convs everywhere: the run's table plan may hold oneDNN calls (float32 training
    # from batch 16 on AVX-512), which without_custom_calls would replace.
    config = json.loads((copy / "config.json").read_text())
    config["conv_algorithm"] = "xla"
    (copy / "config.json").write_text(json.dumps(config))
    model = open_run(copy).model()
    assert without_custom_calls(model) is model


def test_layoutlab_targets_reads_both_spellings():
    text = (
        f"%0 = stablehlo.custom_call @{TARGET}(%arg0) : ...\n"
        'custom_call_target="layoutlab_onednn_conv_bwd_data"\n'
        "%1 = stablehlo.custom_call @Sharding(%0)\n"
        'call_target_name = "layoutlab_onednn_conv_bwd_weights"'
    )
    assert layoutlab_targets(text) == {
        TARGET,
        "layoutlab_onednn_conv_bwd_data",
        "layoutlab_onednn_conv_bwd_weights",
    }
