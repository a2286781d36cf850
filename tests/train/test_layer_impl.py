"""``TrainConfig.layer_impl``: how a run's batch norms and max pools compute, one setting of
the run (``--layer-impl``, ``--set layer_impl=...``) that every command building the run's
program takes from its ``RunSpec``.

The step's custom calls are read from its jaxpr (tracing only, no compile: the oneDNN calls
are ``ffi_call``s there, which XLA compiles into the same custom calls and never adds or
removes), on ResNet-18's tiny variant with the ImageNet stem, which has both kinds of layer.
"""

import re

import jax
import jax.numpy as jnp
import pytest
from cli_helpers import one_line_error

from layoutlab import cli
from layoutlab.nn import norm_onednn, pool_onednn
from layoutlab.nn.norm import BATCH_NORM_IMPLS
from layoutlab.nn.pooling import MAX_POOL_IMPLS
from layoutlab.train.command import config_from_flags
from layoutlab.train.config import TrainConfig
from layoutlab.train.config_checks import LAYER_IMPLS
from layoutlab.train.program import build_program
from layoutlab.train.spec import InputSpec, resolve_spec

STEM_POOL = ((1, 3, 3, 1), (1, 2, 2, 1), ((0, 0), (1, 1), (1, 1), (0, 0)))
needs_onednn_layers = pytest.mark.skipif(
    norm_onednn.supports((2, 2, 2, 16), jnp.bfloat16, False, 1e-5) is not None
    or pool_onednn.supports((2, 9, 9, 8), jnp.bfloat16, *STEM_POOL) is not None,
    reason="oneDNN batch normalization or max pooling unavailable",
)
MODEL = ["--model", "resnet18", "--tiny", "--stem", "imagenet", "--precision", "mixed_bf16"]
MODEL += ["--batch-size", "2"]


def _onednn_calls(spec) -> set[str]:
    """The oneDNN call targets of ``spec``'s train step, on 32x32 images."""
    inputs = InputSpec.for_model(spec.model, (32, 32, 3), 10, spec.batch_size)
    program = build_program(spec, inputs)
    state = jax.eval_shape(program.init)
    jaxpr = jax.make_jaxpr(program.train_step)(state, *inputs.batch(spec.layout))
    return set(re.findall(r"layoutlab_onednn_\w+", str(jaxpr)))


def test_a_bad_layer_impl_is_one_error_line(capsys, tmp_path):
    # One set of names for both layers, the nn layers' own.
    assert LAYER_IMPLS == BATCH_NORM_IMPLS == MAX_POOL_IMPLS == ("auto", "xla")
    assert TrainConfig().layer_impl == "auto"
    workdir = tmp_path / "run"
    code = cli.main(["train", "--workdir", str(workdir), "--set", "layer_impl=onednn"])
    one_line_error(capsys.readouterr().err, "layer_impl must be one of auto, xla", "'onednn'")
    assert code == 2 and not workdir.exists()


@needs_onednn_layers
def test_layer_impl_xla_leaves_no_onednn_batch_norm_or_max_pool_in_the_step():
    def spec(*flags):
        args = cli.build_parser().parse_args(["train", *MODEL, *flags])
        return resolve_spec(config_from_flags(args))

    default, forced = spec(), spec("--set", "layer_impl=xla")
    assert forced.layer_impl == forced.config.layer_impl == "xla"
    assert {"layoutlab_onednn_batch_norm", "layoutlab_onednn_max_pool"} <= _onednn_calls(default)
    assert not {t for t in _onednn_calls(forced) if "batch_norm" in t or "max_pool" in t}
    # A data-parallel run runs XLA's layers whatever it asks (statistics over the global batch).
    assert resolve_spec(TrainConfig(data_parallel=True)).layer_impl == "xla"


def test_every_command_that_builds_the_run_takes_the_flag(monkeypatch, capsys):
    from layoutlab.train.run_flags import run_config
    from layoutlab.xla import inspect

    parser = cli.build_parser()
    commands = (["train", *MODEL], ["compare", *MODEL, "--against", "fp32"])
    commands += (["bench", "--model", "resnet18", "--out", "unwritten.json"],)
    for command in commands:
        args = parser.parse_args([*command, "--layer-impl", "xla"])
        assert run_config(args).layer_impl == "xla", command
    # inspect hands it to the spec its program is built from (build_program: the test above).
    seen = []

    def spy(spec, inputs, **kwargs):
        seen.append(spec)
        raise ValueError("stop before compiling")

    monkeypatch.setattr(inspect, "build_abstract", spy)
    assert cli.main(["inspect", *MODEL, "--mode", "train", "--layer-impl", "xla"]) == 2
    one_line_error(capsys.readouterr().err, "stop before compiling")
    assert [s.layer_impl for s in seen] == ["xla"]
