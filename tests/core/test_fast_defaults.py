"""Fast defaults (issue 20): what a run gets without speed flags, and each opt-out.

The defaults are read back from what the run recorded and compiled (config.json, the
inspect report's compile options and kernel layouts, bench rows), not from the code that
sets them. The shipped conv table behind ``conv_algorithm="auto"``, and the numerics of its
``winograd4_full``, are checked in ``test_default_conv_table.py``.
"""

import json
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from block_server import BlockServer
from flax import nnx

from layoutlab import cli, fast_defaults, models
from layoutlab.host.memory import ENV_SETTING_PER_THREAD
from layoutlab.nn import ConvSettings, configure
from layoutlab.nn.conv_config import conv_settings
from layoutlab.train.config import TrainConfig
from layoutlab.train.loop import train_and_evaluate
from layoutlab.xla.flags import CPU_FAST_OPTIONS

_YNN = "xla_cpu_experimental_ynn_fusion_type"
_TINY = ["--model", "small_cnn", "--model-arg", "width=4", "--model-arg", "hidden=8"]

# The CLI's default run and the Python API's run the same tiny NCHW model at batch 16 for 2
# steps: the second reads the first's train, eval and init programs back (~6 s of CPU).
pytestmark = pytest.mark.usefixtures("shared_compiles")


def test_default_train_run_records_the_fast_configuration(tmp_path, capsys):
    workdir = tmp_path / "run"
    argv = ["train", *_TINY, "--steps", "2", "--batch-size", "16", "--layout", "NCHW",
            "--workdir", str(workdir), "--quiet"]  # fmt: skip
    assert cli.main(argv) == 0
    assert "conv plan: shipped table" in capsys.readouterr().out
    config = json.loads((workdir / "config.json").read_text())
    assert config["cpu_fast"] is True
    assert config["kernel_storage"] == "channels_last"  # resolved on CPU, stored resolved
    assert config["activation_storage"] == "channels_last"
    assert config["conv_algorithm"] == "auto"
    entries = config["conv_plan"]["convs"]
    sources = {e["evidence"]["source"] for e in entries.values()}
    assert entries and all(s.startswith("default table") for s in sources), sources


@pytest.mark.parametrize(
    ("flags", "field", "value"),
    [
        (["--no-cpu-fast"], "cpu_fast", False),
        (["--kernel-storage", "layout"], "kernel_storage", "layout"),
        (["--activation-storage", "layout"], "activation_storage", "layout"),
        (["--conv-algo", "xla"], "conv_algorithm", "xla"),
    ],
)
def test_each_opt_out_turns_off_its_part_only(tmp_path, flags, field, value):
    from layoutlab.train.command import build_config
    from layoutlab.train.config import validate
    from layoutlab.train.spec import resolve_spec

    argv = ["train", *_TINY, "--workdir", str(tmp_path), *flags]
    config = resolve_spec(validate(build_config(cli.build_parser().parse_args(argv))[0], 1)).config
    fast = {"cpu_fast": True, "kernel_storage": "channels_last", "conv_algorithm": "auto",
            "activation_storage": "channels_last"}  # fmt: skip
    assert {k: getattr(config, k) for k in fast} == {**fast, field: value}


def test_python_api_gets_the_same_defaults(tmp_path):
    config = TrainConfig(model="small_cnn", model_kwargs={"width": 4, "hidden": 8}, layout="NCHW",
                         num_steps=2, batch_size=16, log_every=0, tensorboard=False)  # fmt: skip
    train_and_evaluate(config, tmp_path / "api", quiet=True)
    saved = json.loads((tmp_path / "api" / "config.json").read_text())
    assert saved["kernel_storage"] == "channels_last" and saved["conv_plan"] is not None
    # A config saved before these defaults existed keeps what it ran with.
    old = {k: v for k, v in saved.items() if k not in ("conv_algorithm", "kernel_storage",
                                                       "activation_storage",
                                                       "cpu_fast")}  # fmt: skip
    legacy = TrainConfig.from_dict(old)
    got = (legacy.conv_algorithm, legacy.kernel_storage, legacy.activation_storage, legacy.cpu_fast)
    assert got == ("xla", "layout", "layout", False)


def test_inspect_reads_back_options_and_kernel_layout_of_a_default_train_step(capsys):
    # The tiny small_cnn at 16x16: big enough that YNNPACK takes its BatchNorm reductions
    # (at its 8x8 default input they are too small for it, with or without the options),
    # still a small largest conv output (4 x 16 x 16 x 4) for the options' rule below.
    def report(*flags):
        argv = ["inspect", "--model", "small_cnn", "--tiny", "--image-size", "16", "--layout",
                "NCHW", "--mode", "train", "--batch-size", "4", "--json", "-", *flags]  # fmt: skip
        assert cli.main(argv) == 0
        return json.loads(capsys.readouterr().out)

    fast = report()
    # The options of a step whose largest conv output is small (the tiny model at batch 4).
    small = fast_defaults.fast_compile_options("train", activation=1)
    assert fast["flags"]["compiler_options"] == small
    assert _YNN in fast["flags"]["compiler_options"]
    assert fast["kernel_storage"] == "channels_last" and fast["conv_algorithm"] == "auto"
    assert fast["conv_plan"]  # the shipped table's choices, one per conv
    assert fast["activation_storage"] == "channels_last"
    plain = report("--no-cpu-fast", "--kernel-storage", "layout", "--conv-algo", "xla",
                   "--activation-storage", "layout")  # fmt: skip
    assert plain["flags"]["compiler_options"] == {}
    # OIHW kernels in NCHW are transposed on every call; HWIO ones are not (the training
    # step's remaining kernel-shaped transposes belong to the weight gradients).
    assert plain["totals"]["kernel_transposes"] > fast["totals"]["kernel_transposes"]
    assert plain["kernel_storage"] == "layout" and plain["conv_algorithm"] == "xla"
    assert plain["activation_storage"] == "layout"

    # Read back from the compiled program itself: the convs XLA compiled. By default the NCHW
    # model's layers compute in NHWC with HWIO kernels: no conv of the program is NCHW.
    def logical(rep):
        return {c["logical"] for c in rep["convolutions"]}

    assert "NHWC*HWIO->NHWC" in logical(fast) and not any("NCHW" in s for s in logical(fast))
    # Each opt-out alone: HWIO kernels in an NCHW program, and OIHW ones in plain XLA. The
    # forward convs say it, so the NCHW program is a forward (its training step's forward
    # convs are the same, and a training step compiles about 5x slower).
    # XLA's convs named: at batch 4 the AVX-512 table runs float32 inference convs as oneDNN
    # calls, which take HWIO kernels whatever the storage and are not XLA convolutions.
    nchw = report("--activation-storage", "layout", "--mode", "infer", "--conv-algo", "xla")
    nchw_fwd = {s for s in logical(nchw) if s.startswith("NCHW*")}
    assert "NCHW*HWIO->NCHW" in nchw_fwd and not any("OIHW" in s for s in nchw_fwd)
    plain_fwd = {s for s in logical(plain) if s.startswith("NCHW*")}
    assert "NCHW*OIHW->NCHW" in plain_fwd and not any("HWIO" in s for s in plain_fwd)
    # The options: YNNPACK takes the BatchNorm reductions of a training step, which it does
    # not when given only the dots; every other setting is the same on both sides.
    ynn = "kCustom(__ynn_fusion)"
    with_options = fast["fusion_kinds"].get(ynn, 0)
    dots = f"{_YNN}=LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"
    dots_only = report("--xla-option", dots)["fusion_kinds"].get(ynn, 0)
    assert with_options > dots_only


def test_unknown_fast_option_is_left_out_with_one_notice(monkeypatch, capsys):
    monkeypatch.setitem(CPU_FAST_OPTIONS, "train", {"xla_cpu_no_such_option_issue20": True,
                                                    **CPU_FAST_OPTIONS["train"]})  # fmt: skip
    got = fast_defaults.fast_compile_options("train", "cpu")
    assert "xla_cpu_no_such_option_issue20" not in got and _YNN in got
    again = fast_defaults.fast_compile_options("train", "cpu")  # probed once per process
    assert again == got
    notes = [line for line in capsys.readouterr().err.splitlines() if line]
    assert len(notes) == 1 and notes[0].startswith("note: ") and "no_such_option" in notes[0]
    assert fast_defaults.fast_compile_options("train", "gpu") == {}  # never CPU options on GPU
    assert fast_defaults.default_kernel_storage("gpu") == "layout"
    assert fast_defaults.default_activation_storage("gpu") == "layout"


def test_torch_round_trip_and_convert_layout_are_exact_with_hwio_kernels():
    from layoutlab.compare.torch_weights import load_torch_state_dict, to_torch_state_dict
    from layoutlab.nn.convert import convert_layout

    pytest.importorskip("torch")
    kw = dict(width=4, hidden=8)
    model = models.create("small_cnn", layout="NCHW", rngs=nnx.Rngs(1), **kw)
    model = configure(
        model, ConvSettings(kernel_storage=fast_defaults.default_kernel_storage("cpu"))
    )
    assert {spec for _, spec in conv_settings(model).values()} == {"HWIO"}
    state = to_torch_state_dict(model)
    other = models.create("small_cnn", layout="NCHW", rngs=nnx.Rngs(2), **kw)
    other = configure(other, ConvSettings(kernel_storage="channels_last"))
    load_torch_state_dict(other, state)
    model.eval(), other.eval()  # no dropout: their rngs differ
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 1, 8, 8)), jnp.float32)

    # One program per model structure rather than one compile per op: model and other
    # share theirs (their weights are its arguments).
    forward = nnx.jit(lambda m, inputs: m(inputs))
    want = np.asarray(forward(model, x))
    np.testing.assert_array_equal(np.asarray(forward(other, x)), want)  # same weights
    nhwc = convert_layout(model, "NHWC")
    nhwc.eval()
    # The other layout: equal up to float32 reassociation of the same sums (1e-5).
    got = np.asarray(forward(nhwc, jnp.moveaxis(x, 1, -1)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_default_keep_host_memory_applies_before_jax_starts(tmp_path):
    """In a fresh process the CLI's default keeps host memory with one malloc arena for big
    batches and with per-thread arenas for small ones (the digits job's 32 x 8 x 8);
    ``--no-keep-host-memory`` leaves glibc alone. The bench then fails on its unknown model,
    after the setting and before any compile. Forked from one process that imported the CLI
    without starting JAX's backend (``tests/helpers/block_server.py``), ~2.5 s of imports
    paid once; a new interpreter where glibc must read ``GLIBC_TUNABLES`` at its start."""
    code = (
        "import sys; from layoutlab import cli; from layoutlab.host import host_memory_state;"
        "assert cli.main(sys.argv[1:]) == 2; print(host_memory_state().how)"
    )
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    (tmp_path / "forks").mkdir()
    server = BlockServer(env, tmp_path / "forks", preload=("layoutlab.cli", "layoutlab.host"))

    def kept(*flags, tunables=None):
        argv = ["bench", "--model", "no_such_model", "--out", str(tmp_path), *flags]
        if tunables:
            out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True,
                                 text=True, timeout=300, check=True,
                                 env={**env, "GLIBC_TUNABLES": tunables}).stdout  # fmt: skip
        else:
            cwd = tmp_path / "forks" / str(len(list((tmp_path / "forks").iterdir())))
            cwd.mkdir()
            rc, out, err = server.run(f"import sys; sys.argv[1:] = {argv!r}\n{code}", cwd, 300)
            assert rc == 0, err[-2000:]
        return out.strip().splitlines()[-1]

    try:
        big = ("--image-size", "32", "--batch-sizes", "128")
        assert kept(*big) == "mallopt"
        assert kept(*big, "--no-keep-host-memory") == "default glibc malloc"
        assert kept("--image-size", "8", "--batch-sizes", "32") == "mallopt (per-thread arenas)"
        # The host-memory guide's way to per-thread arenas at any batch, from the command line.
        per_thread = ENV_SETTING_PER_THREAD.split("=", 1)[1]
        assert kept(*big, tunables=per_thread) == "environment (per-thread arenas)"
    finally:
        server.close()


def test_bench_rows_say_which_defaults_ran_and_baseline_plain_adds_plain_rows(
    tmp_path, monkeypatch, capsys
):
    from layoutlab.bench.results import load_results

    monkeypatch.setenv("LAYOUTLAB_AUTOTUNE_CACHE", str(tmp_path / "cache.json"))
    # Forward steps only: the labels depend on neither mode nor layout, and a forward
    # compiles about 5x faster than a training step. Each mode's own options in the cases
    # a sweep runs: test_bench_conv_options.py::test_cpu_fast_sweep_uses_each_modes_options.
    common = ["bench", *_TINY, "--precisions", "fp32",
              "--batch-sizes", "2", "--modes", "infer", "--repeats", "1", "--warmup", "0",
              "--no-plots", "--no-roofline"]  # fmt: skip
    argv = [*common, "--layouts", "NHWC,NCHW", "--baseline-plain", "--out", str(tmp_path / "a")]
    assert cli.main(argv) == 0
    rows = load_results(tmp_path / "a", source="csv").rows
    keys = ("layout", "defaults", "conv_algo", "kernel_storage", "activation_storage")
    got = sorted(tuple(r[k] for k in keys) for r in rows)
    assert got == [
        ("NCHW", "fast", "auto", "channels_last", "channels_last"),
        ("NCHW", "plain", "xla", "layout", "layout"),
        ("NHWC", "fast", "auto", "channels_last", "channels_last"),
        ("NHWC", "plain", "xla", "layout", "layout"),
    ]
    fast = [r for r in rows if r["defaults"] == "fast"]
    plain = [r for r in rows if r["defaults"] == "plain"]
    assert all(r["conv_plan_source"] == "table" for r in fast)  # empty cache, short run
    assert all(_YNN in json.loads(r["xla_options"]) for r in fast)
    assert all(json.loads(r["xla_options"]) == {} and not r["conv_plan_source"] for r in plain)
    assert "| plain XLA |" in capsys.readouterr().out
    # An opt-out flag makes the rows "custom": they are no longer the defaults (one layout:
    # the label does not depend on it).
    argv = [*common, "--layouts", "NCHW", "--no-cpu-fast", "--out", str(tmp_path / "b")]
    assert cli.main(argv) == 0
    rows = load_results(tmp_path / "b", source="csv").rows
    assert len(rows) == 1 and {r["defaults"] for r in rows} == {"custom"}
    assert all(json.loads(r["xla_options"]) == {} for r in rows)
