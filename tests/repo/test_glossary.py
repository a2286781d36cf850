"""docs/glossary.md: every term the issue names has a section, the page is in the docs'
navigation, and the names it uses for each exist as it says."""

import dataclasses
import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
TERMS = ["Layout", "Compute layout", "Kernel storage", "Physical format", "Plan", "Eval plan",
         "Table", "Tuning", "Cache"]  # fmt: skip
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
