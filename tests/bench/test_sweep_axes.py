"""``SweepConfig`` as axes over ``TrainConfig`` fields (issue 68): the cases a ``layoutlab
bench`` command runs are the ones it ran when the sweep repeated a run's settings as its own
fields, and a sweep's axes may be any run field."""

import dataclasses
import json

import pytest

import layoutlab.fast_defaults as fast_defaults
import layoutlab.models.registry as registry
from layoutlab import cli, models
from layoutlab.bench.jax_runner import case_spec
from layoutlab.bench.sweep import SweepConfig, run_sweep, validate
from layoutlab.bench.sweep_cases import points
from layoutlab.train.config import TrainConfig
from layoutlab.train.spec import config_for

TINY = models.spec("small_cnn").tiny
_YNN = "xla_cpu_experimental_ynn_fusion_type"
_DOT, _REDUCE = "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT", "LIBRARY_FUSION_TYPE_REDUCE"
_ADAMW = "adamw(lr=0.003, wd=0.0001, cosine over 1000 steps, warmup 50"
_COMMON = {"cpu_fast": False, "data_parallel": False, "eval_batch_size": 512,
           "loss_scale": "none", "model_kwargs": {"hidden": 16, "width": 4}}  # fmt: skip

# Captured from the code before the change (commit 9b1ebde) on a CPU taken to be AVX-512:
# command line -> (each group's cases, JAX's as "mode batch input layout precision conv_algo
# kernel/activation storage defaults conv_tune o<its XLA options' index>" (cl: channels_last),
# PyTorch's as "... torch memory_format"; the XLA options; what each case's RunSpec records
# beyond those, with its optimizer's label).
BEFORE = {
    "main": (
        "--layouts NHWC,NCHW --precisions fp32,mixed_bf16 --batch-sizes 2,4 "
        "--conv-algos auto,xla --torch",
        [
            [
                "infer b2 8x8x1 NHWC fp32 auto cl/cl fast auto o0",
                "infer b2 8x8x1 NCHW fp32 torch contiguous",
                "infer b2 8x8x1 NHWC fp32 xla cl/cl custom auto o0",
                "infer b2 8x8x1 NHWC fp32 torch channels_last",
                "infer b2 8x8x1 NCHW fp32 auto cl/cl fast auto o0",
                "infer b2 8x8x1 NCHW fp32 xla cl/cl custom auto o0",
            ],
            [
                "infer b2 8x8x1 NHWC mixed_bf16 auto cl/cl fast auto o0",
                "infer b2 8x8x1 NCHW amp_bf16 torch contiguous",
                "infer b2 8x8x1 NHWC mixed_bf16 xla cl/cl custom auto o0",
                "infer b2 8x8x1 NHWC amp_bf16 torch channels_last",
                "infer b2 8x8x1 NCHW mixed_bf16 auto cl/cl fast auto o0",
                "infer b2 8x8x1 NCHW mixed_bf16 xla cl/cl custom auto o0",
            ],
            [
                "infer b4 8x8x1 NHWC fp32 auto cl/cl fast auto o0",
                "infer b4 8x8x1 NCHW fp32 torch contiguous",
                "infer b4 8x8x1 NHWC fp32 xla cl/cl custom auto o0",
                "infer b4 8x8x1 NHWC fp32 torch channels_last",
                "infer b4 8x8x1 NCHW fp32 auto cl/cl fast auto o0",
                "infer b4 8x8x1 NCHW fp32 xla cl/cl custom auto o0",
            ],
            [
                "infer b4 8x8x1 NHWC mixed_bf16 auto cl/cl fast auto o0",
                "infer b4 8x8x1 NCHW amp_bf16 torch contiguous",
                "infer b4 8x8x1 NHWC mixed_bf16 xla cl/cl custom auto o0",
                "infer b4 8x8x1 NHWC amp_bf16 torch channels_last",
                "infer b4 8x8x1 NCHW mixed_bf16 auto cl/cl fast auto o0",
                "infer b4 8x8x1 NCHW mixed_bf16 xla cl/cl custom auto o0",
            ],
            [
                "train b2 8x8x1 NHWC fp32 auto cl/cl fast auto o1",
                "train b2 8x8x1 NCHW fp32 torch contiguous",
                "train b2 8x8x1 NHWC fp32 xla cl/cl custom auto o1",
                "train b2 8x8x1 NHWC fp32 torch channels_last",
                "train b2 8x8x1 NCHW fp32 auto cl/cl fast auto o1",
                "train b2 8x8x1 NCHW fp32 xla cl/cl custom auto o1",
            ],
            [
                "train b2 8x8x1 NHWC mixed_bf16 auto cl/cl fast auto o1",
                "train b2 8x8x1 NCHW amp_bf16 torch contiguous",
                "train b2 8x8x1 NHWC mixed_bf16 xla cl/cl custom auto o1",
                "train b2 8x8x1 NHWC amp_bf16 torch channels_last",
                "train b2 8x8x1 NCHW mixed_bf16 auto cl/cl fast auto o1",
                "train b2 8x8x1 NCHW mixed_bf16 xla cl/cl custom auto o1",
            ],
            [
                "train b4 8x8x1 NHWC fp32 auto cl/cl fast auto o1",
                "train b4 8x8x1 NCHW fp32 torch contiguous",
                "train b4 8x8x1 NHWC fp32 xla cl/cl custom auto o1",
                "train b4 8x8x1 NHWC fp32 torch channels_last",
                "train b4 8x8x1 NCHW fp32 auto cl/cl fast auto o1",
                "train b4 8x8x1 NCHW fp32 xla cl/cl custom auto o1",
            ],
            [
                "train b4 8x8x1 NHWC mixed_bf16 auto cl/cl fast auto o1",
                "train b4 8x8x1 NCHW amp_bf16 torch contiguous",
                "train b4 8x8x1 NHWC mixed_bf16 xla cl/cl custom auto o1",
                "train b4 8x8x1 NHWC amp_bf16 torch channels_last",
                "train b4 8x8x1 NCHW mixed_bf16 auto cl/cl fast auto o1",
                "train b4 8x8x1 NCHW mixed_bf16 xla cl/cl custom auto o1",
            ],
        ],
        [{_YNN: _DOT}, {_YNN: f"{_DOT},{_REDUCE}"}],
        [{**_COMMON, "learning_rate": 0.01, "optimizer": "momentum", "schedule": "constant",
          "warmup_steps": 0, "weight_decay": 0.0,
          "optimizer_label": "momentum(lr=0.01, momentum=0.9, constant over 1000 steps)"}],
    ),
    "plain": (
        "--layouts NCHW,NHWC --precisions mixed_bf16,bf16 --batch-sizes 8 --modes train "
        "--conv-algos xla,auto,im2col --baseline-plain --kernel-storage layout "
        "--xla-option xla_cpu_enable_fast_math=false",
        [
            [
                "train b8 8x8x1 NCHW mixed_bf16 xla layout/cl custom auto o0",
                "train b8 8x8x1 NCHW mixed_bf16 auto layout/cl custom auto o0",
                "train b8 8x8x1 NCHW mixed_bf16 im2col layout/cl custom auto o0",
                "train b8 8x8x1 NCHW mixed_bf16 xla layout/layout plain+xla_layers auto o1",
                "train b8 8x8x1 NHWC mixed_bf16 xla layout/cl custom auto o0",
                "train b8 8x8x1 NHWC mixed_bf16 auto layout/cl custom auto o0",
                "train b8 8x8x1 NHWC mixed_bf16 im2col layout/cl custom auto o0",
                "train b8 8x8x1 NHWC mixed_bf16 xla layout/layout plain+xla_layers auto o1",
                "train b8 8x8x1 NCHW bf16 xla layout/cl custom auto o0",
                "train b8 8x8x1 NCHW bf16 auto layout/cl custom auto o0",
                "train b8 8x8x1 NCHW bf16 im2col layout/cl custom auto o0",
                "train b8 8x8x1 NCHW bf16 xla layout/layout plain+xla_layers auto o1",
                "train b8 8x8x1 NHWC bf16 xla layout/cl custom auto o0",
                "train b8 8x8x1 NHWC bf16 auto layout/cl custom auto o0",
                "train b8 8x8x1 NHWC bf16 im2col layout/cl custom auto o0",
                "train b8 8x8x1 NHWC bf16 xla layout/layout plain+xla_layers auto o1",
            ],
        ],
        [{"xla_cpu_enable_fast_math": False, _YNN: f"{_DOT},{_REDUCE}"}, {}],
        [{**_COMMON, "optimizer_label": f"{_ADAMW})"},
         {**_COMMON, "optimizer_label": f"{_ADAMW}, float32 state)"}],
    ),
}  # fmt: skip


def _unprobed(
    mode, backend=None, optimizer=None, batch=None, depthwise=False, activation=None,
    onednn_convs=False,
):  # fmt: skip
    """``fast_compile_options`` on an AVX-512 CPU, without asking the jaxlib."""
    if (backend or "cpu") != "cpu":
        return {}
    return fast_defaults.cpu_fast_options(
        mode, optimizer, "avx512", batch, depthwise, activation, onednn_convs
    )


def _abbrev(storage: str) -> str:
    return "cl" if storage == "channels_last" else storage


def _bench_cases(argv: list[str], monkeypatch, tmp_path):
    """The groups of cases ``layoutlab bench argv`` times (nothing is set up or run), their
    XLA options and the records of their RunSpecs, in ``BEFORE``'s form."""
    import layoutlab.bench.sweep as sweep

    monkeypatch.setattr(fast_defaults, "cpu_kind", lambda: "avx512")
    monkeypatch.setattr(fast_defaults, "accepted_cpu_options", dict)
    monkeypatch.setattr(registry, "fast_compile_options", _unprobed)
    # Captured where the table ran no conv on oneDNN, whatever this CPU's table does.
    monkeypatch.setattr(registry, "table_runs_onednn", lambda dtype, batch=None: False)
    # PyTorch's cases are made whether or not it is installed.
    monkeypatch.setattr(
        sweep, "_torch_device", lambda config, notes: "cpu" if config.torch else None
    )
    groups = []

    def record(runners, **kw):
        groups.append([r.case for r in runners])
        return []

    monkeypatch.setattr(sweep, "run_group", record)
    out = ["--backend", "cpu", "--no-roofline", "--no-plots", "--out", str(tmp_path / "b")]
    cli.main(["bench", "--model", "small_cnn", "--tiny", *argv, *out])
    options, records, shown = [], [], []
    defaults = TrainConfig().to_dict()
    for group in groups:
        shown.append([])
        for case in group:
            row = case.row()
            what = " ".join(
                [row["mode"], f"b{row['batch_size']}", row["input_shape"], row["layout"]]
                + [row["precision"]]
            )
            if row["framework"] != "layoutlab":
                shown[-1].append(f"{what} torch {row['memory_format']}")
                continue
            opts = json.loads(row["xla_options"])
            if opts not in options:
                options.append(opts)
            spec, _ = case_spec(case)
            in_row = ("layout", "precision", "batch_size", "conv_algorithm", "kernel_storage",
                      "activation_storage", "layer_impl", "xla_options")  # fmt: skip
            record = {k: v for k, v in spec.config.to_dict().items()
                      if v != defaults[k] and k not in in_row}  # fmt: skip
            record["optimizer_label"] = spec.optimizer.label
            if record not in records:
                records.append(record)
            storages = f"{_abbrev(row['kernel_storage'])}/{_abbrev(row['activation_storage'])}"
            # The plain baseline runs XLA's batch norms and max pools as well.
            layers = "+xla_layers" if row["layer_impl"] == "xla" else ""
            shown[-1].append(
                f"{what} {row['conv_algo']} {storages} {row['defaults']}{layers} "
                f"{case.conv_tune} o{options.index(opts)}"
            )
    return shown, options, records


@pytest.mark.parametrize("name", BEFORE)
def test_bench_runs_the_cases_it_ran_before_the_sweep_became_axes(name, monkeypatch, tmp_path):
    argv, groups, options, records = BEFORE[name]
    got_groups, got_options, got_records = _bench_cases(argv.split(), monkeypatch, tmp_path)
    assert got_groups == groups
    assert got_options == options
    assert got_records == records


def test_an_axis_is_any_run_field_and_an_unknown_one_is_one_clear_error():
    run = TrainConfig(model="small_cnn", model_kwargs=TINY)
    sweep = SweepConfig(run, axes={"remat": (False, True), "batch_size": (2,)}, modes=("train",))
    checked = validate(sweep)
    runs = points(checked)
    assert [(r.remat, r.batch_size) for r in runs] == [(False, 2), (True, 2)]
    assert all(dataclasses.replace(r, remat=False, batch_size=32) == checked.run for r in runs)
    assert [case_spec(c)[0].remat for c in _cases(checked)] == [False, True]
    # No axes: both layouts in fp32 and mixed_bf16 (docs/guides/benchmarks.md).
    default = points(validate(SweepConfig(run, modes=("infer",))))
    assert [(r.precision, r.layout) for r in default] == [
        ("fp32", "NHWC"), ("fp32", "NCHW"), ("mixed_bf16", "NHWC"), ("mixed_bf16", "NCHW"),
    ]  # fmt: skip

    def never(case):
        raise AssertionError("a runner was built for an invalid sweep")

    with pytest.raises(ValueError, match="Unknown sweep axis 'layouts': an axis is a TrainConfig"):
        run_sweep(SweepConfig(run, axes={"layouts": ("NHWC",)}), jax_runner=never)
    with pytest.raises(ValueError, match="axis remat must be a list of values"):
        run_sweep(SweepConfig(run, axes={"remat": True}), jax_runner=never)
    with pytest.raises(ValueError, match="TrainConfig.remat must be bool"):
        run_sweep(SweepConfig(run, axes={"remat": ("yes",)}), jax_runner=never)


def _cases(config):
    from layoutlab.bench.sweep_cases import sweep_groups

    return [case for cases, _ in sweep_groups(config, None) for case in cases]


def test_beside_pytorch_the_run_must_make_pytorchs_update():
    run = dict(model="small_cnn", model_kwargs=TINY)
    with pytest.raises(ValueError, match=r"config_for\('pytorch'"):
        validate(SweepConfig(TrainConfig(**run), torch=True))
    assert validate(SweepConfig(config_for("pytorch", **run), torch=True)).run.optimizer == (
        "momentum"
    )


def test_machine_json_records_the_run_and_axes_and_parts_merge_their_batch_sizes(
    monkeypatch, tmp_path
):
    import subprocess

    import layoutlab.bench.host_memory_parts as parts
    from layoutlab.bench.results import BenchResults
    from layoutlab.bench.sweep_config import config_dict

    run = TrainConfig(model="small_cnn", model_kwargs=TINY)
    record = config_dict(validate(SweepConfig(run, axes={"batch_size": (1,)}, modes=("infer",))))
    assert record["run"] == validate(SweepConfig(run)).run.to_dict()
    assert record["axes"] == {"batch_size": [1]} and record["modes"] == ["infer"]

    def part(folder):
        batches = [int(b) for b in folder.name.split("-b")[1].split("-")]
        sweep = {**record, "axes": {"batch_size": batches}}
        machine = {"sweep": sweep, "host_memory_kept": True}
        return BenchResults(machine, [], [])

    monkeypatch.setattr(subprocess, "run", lambda *a, **kw: subprocess.CompletedProcess(a, 0))
    monkeypatch.setattr(parts, "load_results", part)
    merged = parts.run_parts(["bench"], [[1, 2], [64]], tmp_path).machine["sweep"]
    assert merged["axes"] == {"batch_size": [1, 2, 64]} and merged["run"] == record["run"]
