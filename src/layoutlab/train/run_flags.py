"""One front door for a run's flags in every command: ``add_run_flags`` declares them and
``run_config`` turns them into the ``TrainConfig`` they stand for.

``train``, ``inspect``, ``compare``, ``bench`` and ``autotune`` take the same flags for what
a run is: its model (``--model``, ``--stem``, ``--tiny``, ``--model-arg``), ``--layout``,
``--precision``, ``--batch-size``, its conv settings (``--conv-algo``, ``--kernel-storage``,
``--activation-storage``), how its batch norms and max pools compute (``--layer-impl``) and
its XLA options (``--xla-option``, ``--cpu-fast``). Each is
declared here once: a command picks its defaults, leaves out what it does not take, and
``bench`` takes comma lists of the layouts, precisions, batch sizes and conv algorithms it
sweeps (``multi``). The flags that mean something else per command (``--optimizer``,
``--image-size``, ``--backend``) stay with their commands.

Importing this module imports no JAX (the commands build their parsers from it).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Collection, Mapping
from typing import Any

from layoutlab.arguments import parse_comma_list
from layoutlab.nn.conv_names import ACTIVATION_STORAGES, KERNEL_STORAGES
from layoutlab.train.config import TrainConfig, apply_overrides
from layoutlab.train.config_checks import LAYER_IMPLS

__all__ = ["REQUIRED", "RUN_FLAGS", "add_run_flags", "run_axes", "run_config"]

REQUIRED = object()  # a default that makes the flag required (``--model`` of most commands)
# Each single-valued run flag's destination -> its TrainConfig field; the model flags
# (--stem, --tiny, --model-arg) make ``model_kwargs`` and --xla-option ``xla_options``.
RUN_FLAGS = {
    "model": "model",
    "layout": "layout",
    "precision": "precision",
    "batch_size": "batch_size",
    "conv_algo": "conv_algorithm",
    "kernel_storage": "kernel_storage",
    "activation_storage": "activation_storage",
    "layer_impl": "layer_impl",
    "cpu_fast": "cpu_fast",
}
# dest -> (flag, help, argparse keywords): one entry per flag.
_FLAGS = {
    "model": ("--model", "registry name, e.g. resnet18 (see `layoutlab models`)", {}),
    "stem": ("--stem", "ResNet stem (model_kwargs.stem)", {"choices": ("cifar", "imagenet")}),
    "tiny": (
        "--tiny",
        "the model's tiny variant (fast; its keyword arguments under any others given)",
        {"action": "store_true"},
    ),
    "model_arg": (
        "--model-arg",
        "model option, e.g. width=8 (repeatable; JSON values)",
        {"action": "append", "metavar": "NAME=VALUE"},
    ),
    "layout": ("--layout", "NHWC or NCHW", {}),
    "precision": (
        "--precision",
        "policy name: a preset (fp32, mixed_bf16, ...) or dtypes such as 'p=f32,c=bf16,o=f32'",
        {"metavar": "POLICY"},
    ),
    "batch_size": ("--batch-size", "examples per batch", {}),
    "conv_algo": (
        "--conv-algo",
        "algorithm of every 2D conv: auto, xla or a name from layoutlab.nn.conv_algos",
        {"metavar": "NAME"},
    ),
    "kernel_storage": (
        "--kernel-storage",
        "conv kernel order: auto (channels_last on CPU, layout elsewhere), layout (the "
        "layout's own, OIHW for NCHW) or channels_last (HWIO in every layout: no per-call "
        "kernel transposes in NCHW models on CPU)",
        {"choices": ("auto", *KERNEL_STORAGES)},
    ),
    "activation_storage": (
        "--activation-storage",
        "where an NCHW model computes: auto (channels_last on CPU, layout elsewhere); "
        "channels_last runs its layers in NHWC, inputs and outputs staying NCHW (one "
        "transpose of the input), like PyTorch's channels_last memory format; layout runs "
        "them in NCHW",
        {"choices": ("auto", *ACTIVATION_STORAGES)},
    ),
    "layer_impl": (
        "--layer-impl",
        "how BatchNorm in training (bfloat16 activations) and 2D max pools with overlapping "
        "windows compute: auto (oneDNN's primitive on CPU where it applies) or xla (XLA's "
        "ops everywhere, as a data-parallel run and an exported model run them)",
        {"choices": LAYER_IMPLS},
    ),
    "xla_option": (
        "--xla-option",
        "XLA compile option of the run's programs (repeatable; true/false, numbers or text), "
        "e.g. xla_cpu_enable_fast_math=false; over the --cpu-fast ones",
        {"action": "append", "metavar": "NAME=VALUE"},
    ),
    "cpu_fast": (
        "--cpu-fast",
        "on CPU, compile with layoutlab.xla.cpu_fast_options(mode), the XLA:CPU options "
        "measured fastest for CNNs (convs on Eigen, dots on YNNPACK; in training also "
        "reductions and, but for Adam(W) or oneDNN convs on AVX-512, elementwise "
        "fusions); on by default, --no-cpu-fast turns it off",
        {"action": argparse.BooleanOptionalAction},
    ),
}
# The sweep's form (``multi``) of the axes: dest -> (flag, argparse dest, keywords); the
# axis is the flag's TrainConfig field (``RUN_FLAGS``).
AXES = {
    "layout": ("--layouts", "layouts", {"metavar": "NAME,NAME"}),
    "precision": ("--precisions", "precisions", {"metavar": "POLICY,POLICY"}),
    "batch_size": ("--batch-sizes", "batch_sizes", {"metavar": "N,N"}),
    "conv_algo": ("--conv-algos", "conv_algorithms", {"metavar": "NAME,NAME"}),
}


def _ints(text: str) -> list[int]:
    try:
        return [int(t) for t in parse_comma_list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints, got {text!r}") from None


def add_run_flags(
    parser: argparse.ArgumentParser,
    defaults: Mapping[str, Any] | None = None,
    *,
    multi: bool = False,
    omit: Collection[str] = (),
    notes: Mapping[str, str] | None = None,
) -> None:
    """Declare the run flags on ``parser``.

    ``defaults``: each flag's default by destination (``_FLAGS``' keys; with ``multi``, an
    axis's default is its comma list; ``REQUIRED``: the flag must be given; absent: None).
    ``None`` is ``train``'s form: every flag is "not given" unless given and takes text that
    the config parses, so a ``--config`` or ``--resume`` value stands unless a flag
    overrides it; elsewhere ``--batch-size`` is an int. ``multi``: the sweep's comma lists
    (``AXES``, read by ``run_axes``) instead of those four flags. ``omit``: destinations the
    command does not take. ``notes``: a command's own words to a flag's help, by
    destination. The help names each default (``TrainConfig``'s where the flag has none)."""
    given = dict(defaults or {})
    train = TrainConfig()
    for dest, (flag, text, kw) in _FLAGS.items():
        if dest in omit:
            continue
        kw = dict(kw)
        if multi and dest in AXES:
            flag, field, kw = AXES[dest]
            kw = {**kw, "dest": field, **({"type": _ints} if dest == "batch_size" else {})}
            noun = flag[2:].replace("-", " ")
            text = f"{noun} to sweep, comma-separated (each one a configuration)"
        elif dest == "batch_size" and defaults is not None:
            kw["type"] = int
        default = given.get(dest)
        if default is REQUIRED:
            kw["required"] = True
        else:
            kw["default"] = default
            if default is None and dest in RUN_FLAGS:
                default = getattr(train, RUN_FLAGS[dest])
            if isinstance(default, list):
                default = ",".join(map(str, default))
            if default is not None and not isinstance(default, bool):
                text += f" (default {default})"
        if dest in (notes or {}):
            text += f"; {notes[dest]}"
        parser.add_argument(flag, help=text, **kw)


def _items(items: list[str] | None, flag: str, example: str) -> list[tuple[str, str]]:
    """``NAME=VALUE`` items -> ``(name, value)`` pairs; a malformed one is a ``ValueError``."""
    out = []
    for item in items or []:
        name, sep, value = item.partition("=")
        name = name.strip().lstrip("-")  # --xla-option --xla_foo=1, as in XLA_FLAGS
        if not sep or not name:
            raise ValueError(f"{flag} {item!r} is not of the form NAME=VALUE (e.g. {example}).")
        out.append((name, value))
    return out


def run_config(
    args: argparse.Namespace,
    base: TrainConfig | None = None,
    overrides: Collection[str] = (),
) -> TrainConfig:
    """The ``TrainConfig`` of the run flags in ``args`` (``add_run_flags``): ``base`` (None:
    ``TrainConfig``'s defaults), then each flag given (a model's ``--stem``, then its
    ``--model-arg``s, into ``model_kwargs``; each ``--xla-option`` into ``xla_options``),
    then ``overrides`` (``FIELD=VALUE``, train's other flags and ``--set``: the last wins),
    then ``--tiny``'s keyword arguments under every other. The config is not checked here:
    ``train.config.validate`` and the commands' own checks do that."""
    flags = vars(args)
    items = [
        f"{field}={flags[dest]}"
        for dest, field in RUN_FLAGS.items()
        if flags.get(dest) is not None and not isinstance(flags[dest], bool)
    ]
    if flags.get("cpu_fast") is not None:
        items.append(f"cpu_fast={'true' if flags['cpu_fast'] else 'false'}")
    if flags.get("stem") is not None:
        items.append(f"model_kwargs.stem={flags['stem']}")
    items += [
        f"model_kwargs.{n}={v}" for n, v in _items(flags.get("model_arg"), "--model-arg", "width=8")
    ]
    options = _items(flags.get("xla_option"), "--xla-option", "xla_cpu_enable_fast_math=false")
    items += [f"xla_options.{n}={v}" for n, v in options]
    config = apply_overrides(base or TrainConfig(), [*items, *overrides])
    if flags.get("tiny"):
        from layoutlab import models

        tiny = models.spec(config.model).tiny
        config = dataclasses.replace(config, model_kwargs={**tiny, **config.model_kwargs})
    return config


def run_axes(args: argparse.Namespace) -> dict[str, tuple]:
    """A sweep's axes from ``add_run_flags(multi=True)``: ``TrainConfig`` field -> values
    (``bench.sweep_config.SweepConfig.axes``)."""
    flags = vars(args)
    out = {}
    for dest, (_, name, _) in AXES.items():
        if name in flags:
            value = flags[name]
            out[RUN_FLAGS[dest]] = tuple(
                value if isinstance(value, list) else parse_comma_list(value)
            )
    return out
