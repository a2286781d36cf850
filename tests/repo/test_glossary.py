"""docs/glossary.md: every term the issue names has a section, the page is in the docs'
navigation, and the names it uses for each exist as it says."""

import dataclasses
import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
TERMS = ["Layout", "Compute layout", "Kernel storage", "Physical format", "Plan", "Eval plan",
         "Table", "Tuning", "Cache", "Data source", "Policy name", "Loss-scale name",
         "Spec"]  # fmt: skip
GLOSSARY = (DOCS / "glossary.md").read_text()


def test_every_term_has_a_section():
    headings = re.findall(r"^## (.+)$", GLOSSARY, re.M)
    assert headings == TERMS


def test_the_glossary_is_in_the_navigation():
    toctrees = re.findall(r"```\{toctree\}(.*?)```", (DOCS / "index.md").read_text(), re.S)
    assert any(re.search(r"^glossary$", tree, re.M) for tree in toctrees)


def test_layout_and_storage_names():
    from layoutlab import Layout
    from layoutlab.fast_defaults import default_activation_storage, default_kernel_storage
    from layoutlab.train.config import TrainConfig

    assert {str(x) for x in Layout} == {"NWC", "NCW", "NHWC", "NCHW", "NDHWC", "NCDHW"}
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    assert {
        "layout",
        "activation_storage",
        "kernel_storage",
        "conv_plan",
        "eval_conv_plan",
    } <= fields
    assert default_kernel_storage("cpu") == default_activation_storage("cpu") == "channels_last"
    assert default_kernel_storage("gpu") == default_activation_storage("gpu") == "layout"


def test_plan_table_and_formats():
    from layoutlab.fast_defaults import table_cpu_kind
    from layoutlab.nn.conv_algos import ConvPlan
    from layoutlab.nn.conv_algos.default_plan import DEFAULT_RULES
    from layoutlab.xla import enable_compilation_cache, major_to_minor_for, physical_format

    assert ConvPlan and DEFAULT_RULES and physical_format and enable_compilation_cache
    assert table_cpu_kind("gpu") is None  # off CPU the table has no rules
    assert major_to_minor_for("NCHW", "NHWC") == (0, 2, 3, 1)


def test_autotune_cache_path(tmp_path, monkeypatch):
    from layoutlab.bench.tuning.cache import CACHE_ENV, default_cache_path

    assert CACHE_ENV == "LAYOUTLAB_AUTOTUNE_CACHE"
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_path() == tmp_path / "layoutlab" / "autotune.json"


@pytest.mark.parametrize("flag", ["--layout", "--kernel-storage", "--conv-algo", "--autotune"])
def test_the_train_flags_named_exist(flag):
    from layoutlab import cli

    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    assert flag in sub.choices["train"]._option_string_actions


def _section(term: str) -> str:
    return GLOSSARY.split(f"## {term}\n", 1)[1].split("\n## ", 1)[0]


def _train_option(flag: str):
    from layoutlab import cli

    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return sub.choices["train"]._option_string_actions[flag]


def _first_parameter(function) -> str:
    import inspect

    return next(iter(inspect.signature(function).parameters))


def test_data_source():
    from layoutlab.data import SOURCE_FORMS, get_dataset
    from layoutlab.train.config import TrainConfig

    forms = [form.split()[0] for form in SOURCE_FORMS]
    assert re.findall(r"`([^`]+)`", _section("Data source"))[: len(forms)] == forms
    assert _first_parameter(get_dataset) == "source"
    assert _train_option("--data").metavar == "SOURCE" and TrainConfig().data == "digits"
    with pytest.raises(ValueError) as info:
        get_dataset("imagenet")
    assert str(info.value).startswith("Bad data source 'imagenet'")
    assert all(form in str(info.value) for form in SOURCE_FORMS)


def test_policy_name():
    from layoutlab.precision import PRESETS, get_policy
    from layoutlab.train.config import TrainConfig

    assert {"fp32", "mixed_bf16"} <= set(PRESETS)
    long, short = "params=float32,compute=bfloat16,output=float32", "p=f32,c=bf16,o=f32"
    assert get_policy(long) == get_policy(short) == PRESETS["mixed_bf16"]
    assert get_policy(PRESETS["bf16"]) is PRESETS["bf16"]
    assert _first_parameter(get_policy) == "policy"
    assert _train_option("--precision").metavar == "POLICY" and TrainConfig().precision == "fp32"
    # The grammar difference itself: tests/core/test_precision_policy.py, which also checks
    # that the precision guide says it.
    assert "](guides/precision.md)" in _section("Policy name")
    assert "jmp" in (DOCS / "guides" / "precision.md").read_text()


def test_loss_scale_name():
    import numpy as np

    from layoutlab.loss_scale import (
        DynamicLossScale,
        NoOpLossScale,
        StaticLossScale,
        get_loss_scale,
    )
    from layoutlab.precision import PRESETS
    from layoutlab.train.config import TrainConfig
    from layoutlab.train.run_precision import loss_scale_name

    assert isinstance(get_loss_scale("none"), NoOpLossScale)
    assert float(get_loss_scale("static:8").loss_scale) == 8.0
    assert isinstance(get_loss_scale("static:8"), StaticLossScale)
    assert isinstance(get_loss_scale("dynamic"), DynamicLossScale)
    assert float(get_loss_scale("dynamic:8").loss_scale) == 8.0  # the initial scale
    assert _first_parameter(get_loss_scale) == "scale"
    assert _train_option("--loss-scale").metavar == "SCALE" and TrainConfig().loss_scale == "auto"
    assert PRESETS["mixed_fp16"].compute_dtype == np.float16
    assert loss_scale_name("auto", PRESETS["mixed_fp16"]) == "dynamic"
    assert loss_scale_name("auto", PRESETS["mixed_bf16"]) == "none"


def test_the_five_specs_are_frozen_resolved_values():
    import dataclasses

    from layoutlab import models, train
    from layoutlab.nn.conv_algos import ConvSpec
    from layoutlab.train.config import TrainConfig

    named = re.findall(r"`((?:train|nn\.conv_algos|models)\.\w+Spec)`", _section("Spec"))
    assert named == ["train.RunSpec", "train.InputSpec", "nn.conv_algos.ConvSpec",
                     "models.ModelSpec", "train.OptimizerSpec"]  # fmt: skip
    for cls in (train.RunSpec, train.InputSpec, models.ModelSpec, train.OptimizerSpec):
        assert cls.__dataclass_params__.frozen, cls
    assert issubclass(ConvSpec, tuple)  # a NamedTuple
    model = models.spec("small_cnn")
    assert isinstance(model, models.ModelSpec)
    with pytest.raises(dataclasses.FrozenInstanceError):
        model.name = "other"
    resolved = train.resolve_spec(TrainConfig(loss_scale="auto"))
    assert isinstance(resolved, train.RunSpec) and resolved.config.loss_scale == "none"
