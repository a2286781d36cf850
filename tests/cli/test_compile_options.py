"""One derivation of a run's XLA compile options (``train.fast_config.compile_options``) for
every command: train's config, bench's sweep, inspect, compare and autotune convs each give
the options the code before issue 68 gave (its four derivations: train/fast_config.py,
bench.sweep_config.options_for, inline in xla/command.py and autotune's
fast_defaults.compile_options_from_flags, which read the parsed flags)."""

import pytest

import layoutlab.fast_defaults as fast_defaults
import layoutlab.train.fast_config as fast_config
from layoutlab import cli
from layoutlab.train.config import TrainConfig

_YNN = "xla_cpu_experimental_ynn_fusion_type"
_FAST_MATH_OFF = {"xla_cpu_enable_fast_math": False}


def _ynn(*kinds):
    return {_YNN: ",".join(f"LIBRARY_FUSION_TYPE_{k}" for k in kinds)}


# Captured from the code before the change (commit d6ae3b3) on a CPU taken to be AVX-512
# (the options differ by CPU kind; the jaxlib's acceptance check left out): command ->
# options. ResNet-18 CIFAR at batch 128 has large activations, so an SGD step keeps
# YNNPACK's elementwise fusions where AdamW's (autotune convs, which has no --optimizer)
# leaves them out; small_cnn's batch-1 step gets none of the fast options.
CASES = {
    "resnet18 b128 train sgd": (
        dict(model="resnet18", size="32", batch="128", mode="train", sgd=True, fast=True),
        {
            "train": {**_ynn("INDIVIDUAL_DOT", "REDUCE", "ELTWISE"), **_FAST_MATH_OFF},
            "inspect": {**_ynn("INDIVIDUAL_DOT", "REDUCE", "ELTWISE"), **_FAST_MATH_OFF},
            "bench": {**_ynn("INDIVIDUAL_DOT", "REDUCE", "ELTWISE"), **_FAST_MATH_OFF},
            "autotune": {**_ynn("INDIVIDUAL_DOT", "REDUCE"), **_FAST_MATH_OFF},
        },
    ),
    "small_cnn b1 train": (
        dict(model="small_cnn", size="8", batch="1", mode="train", sgd=False, fast=True),
        {
            "train": _FAST_MATH_OFF,
            "inspect": _FAST_MATH_OFF,
            "bench": _FAST_MATH_OFF,
            "autotune": _FAST_MATH_OFF,
            "compare": {},
        },
    ),
    "small_cnn b8 infer": (
        dict(model="small_cnn", size="8", batch="8", mode="infer", sgd=False, fast=True),
        {
            "train": {**_ynn("INDIVIDUAL_DOT"), **_FAST_MATH_OFF},
            "inspect": {**_ynn("INDIVIDUAL_DOT"), **_FAST_MATH_OFF},
            "bench": {**_ynn("INDIVIDUAL_DOT"), **_FAST_MATH_OFF},
            "autotune": {**_ynn("INDIVIDUAL_DOT"), **_FAST_MATH_OFF},
            "compare": _ynn("INDIVIDUAL_DOT"),
        },
    ),
    "small_cnn b8 train --no-cpu-fast": (
        dict(model="small_cnn", size="8", batch="8", mode="train", sgd=False, fast=False),
        {"train": {}, "inspect": {}, "bench": {}, "autotune": {}, "compare": {}},
    ),
}


class _Stop(ValueError):
    """Raised by a fake where the options were seen: each command reports it as bad input."""


@pytest.fixture
def seen(monkeypatch, tmp_path):
    import layoutlab.bench.sweep as sweep
    import layoutlab.bench.tuning.registry_model as registry_model
    import layoutlab.compare.references as references
    import layoutlab.models.registry as registry
    import layoutlab.xla.inspect as inspect

    monkeypatch.setattr(fast_defaults, "cpu_kind", lambda: "avx512")
    monkeypatch.setattr(fast_defaults, "accepted_cpu_options", dict)
    monkeypatch.setattr(registry, "fast_compile_options", _unprobed_fast_options)
    # The CASES were captured where the table ran no conv on oneDNN, whatever this CPU's table
    # does (test_bench_conv_options.py checks the oneDNN rule).
    monkeypatch.setattr(registry, "table_runs_onednn", lambda dtype, batch=None: False)
    monkeypatch.chdir(tmp_path)
    found = {}
    derive = fast_config.compile_options

    def counted(*args, **kw):
        found["derivations"] = found.get("derivations", 0) + 1
        return derive(*args, **kw)

    monkeypatch.setattr(fast_config, "compile_options", counted)

    def fake(key, get):
        def stop(*args, **kw):
            found[key] = dict(get(args, kw) or {})
            raise _Stop("options seen")

        return stop

    monkeypatch.setattr(inspect, "inspect_model", fake("inspect", lambda a, kw: kw["flags"]))
    monkeypatch.setattr(
        registry_model,
        "autotune_registry_model",
        fake("autotune", lambda a, kw: kw["compiler_options"]),
    )
    monkeypatch.setattr(
        references, "against_layout", fake("compare", lambda a, kw: kw["compiler_options"])
    )
    monkeypatch.setattr(sweep, "run_group", fake("bench", lambda a, kw: a[0][0].case.xla_options))
    return found


def _unprobed_fast_options(mode, backend=None, optimizer=None, batch=None, depthwise=False,
                           activation=None, onednn_convs=False):  # fmt: skip
    """``fast_compile_options`` without asking the jaxlib (which may reject an option)."""
    if (backend or "cpu") != "cpu":
        return {}
    return fast_defaults.cpu_fast_options(
        mode, optimizer, "avx512", batch, depthwise, activation, onednn_convs
    )


@pytest.mark.parametrize("case", CASES)
def test_every_command_derives_the_options_it_did_before(case, seen, capsys):
    c, want = CASES[case]
    options = ["--xla-option", "xla_cpu_enable_fast_math=false"] if c["fast"] else []
    fast = [] if c["fast"] else ["--no-cpu-fast"]
    sgd = ["--optimizer", "pytorch"] if c["sgd"] else []
    model = ["--model", c["model"], "--image-size", c["size"], *fast]
    batch, mode = ["--batch-size", c["batch"]], ["--mode", c["mode"]]
    sweep = ["--batch-sizes", c["batch"], "--modes", c["mode"], "--layouts", "NHWC"]
    sweep += ["--precisions", "fp32", "--no-roofline", "--out", "b"]
    runs = {
        "inspect": ["inspect", *model, *options, *batch, *mode, *sgd],
        "autotune": ["autotune", "convs", *model, *options, *batch, *mode],
        "bench": ["bench", *model, *options, *sweep, *sgd],
        "compare": ["compare", *model, *batch, *mode, "--against", "layout"],
    }
    for command, argv in runs.items():
        if command not in want:  # compare takes no --xla-option and no --optimizer
            continue
        assert cli.main(argv) == 2  # _Stop, once the options were seen
        assert seen.pop("derivations", 0) > 0, f"{command} derives its options elsewhere"
    shape = {"resnet18": "32x32x3", "small_cnn": "8x8x1"}[c["model"]]
    config = TrainConfig(
        model=c["model"],
        data=f"synthetic:{shape}",
        batch_size=int(c["batch"]),
        optimizer="momentum" if c["sgd"] else "adamw",
        xla_options=_FAST_MATH_OFF if c["fast"] else {},
        cpu_fast=c["fast"],
    )
    seen["train"] = fast_config.compile_options(config, c["mode"])
    seen.pop("derivations")
    assert seen == want, capsys.readouterr().err
