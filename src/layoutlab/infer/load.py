"""A trained run read back: its config, data set and checkpointed model, ready to use.

``open_run(workdir, step)`` builds the model exactly as training did
(``layoutlab.train.program.build_model`` of the ``RunSpec`` of the run's ``config.json``, so
the run's conv algorithm and kernel storage apply), then fills its parameters and batch
statistics from a checkpoint. ``checkpoint_state`` is the one place that knows how a
checkpoint's arrays map onto the model's state.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from layoutlab.data import Dataset
from layoutlab.fast_defaults import default_backend, table_cpu_kind
from layoutlab.infer.plan import planned_model
from layoutlab.nn.conv_algos.onednn_packed import pack_kernels, with_packed_kernels
from layoutlab.train.best import BEST_DIR
from layoutlab.train.checkpoint import (
    ForeignCheckpointError,
    IncompatibleCheckpointError,
    read_checkpoint,
)
from layoutlab.train.config import TrainConfig, validate, with_legacy_defaults
from layoutlab.train.loop import CHECKPOINT_DIR
from layoutlab.train.metrics import CONFIG_FILE
from layoutlab.train.program import build_model, eval_defs
from layoutlab.train.run_data import load_run_data
from layoutlab.train.spec import InputSpec, RunSpec, resolve_spec
from layoutlab.train.state import ModelDefs, TrainState, split_model
from layoutlab.train.steps import make_forward

__all__ = [
    "WEIGHTS",
    "NoRunError",
    "Run",
    "checkpoint_state",
    "class_names",
    "jitted_flat_forward",
    "load_model",
    "open_run",
]


# Which weights of a checkpoint a reader uses: the trained ones, or their moving average
# (a run trained with ema_decay; train.ema).
WEIGHTS = ("raw", "ema")


class NoRunError(FileNotFoundError):
    """The workdir, its config or the asked checkpoint does not exist."""


@dataclasses.dataclass(frozen=True)
class Run:
    """A run's resolved config, its data set and the restored model state at ``step``."""

    workdir: Path
    config: TrainConfig
    dataset: Dataset
    step: int
    defs: ModelDefs
    params: nnx.State
    model_state: nnx.State

    # Cached on the instance (the dataclass is frozen, its config too): `predict` on one
    # image called these per image, and resolving the spec and hashing the model's graph
    # definitions for a cache lookup cost about 3 ms of a 15 ms call (ResNet-18).
    @functools.cached_property
    def spec(self) -> RunSpec:
        """The run's ``RunSpec`` (its programs' options, policy, conv plan, ...)."""
        return resolve_spec(self.config)

    @functools.cached_property
    def logits(self) -> Callable:
        """``images -> logits``: the run's eval-mode forward (``make_forward``) on this run's
        state, with the conv plan of ``inference_defs`` for the images' batch, jitted with the run's
        inference XLA options (on CPU those evaluation uses). The state's leaves are flattened once
        here: flattening them on every call slowed a batch-1 call, the logits the same bit for bit
        (docs/performance/measurements.md#a-trained-runs-forward). The compiled program is
        shared by every ``Run`` of the same model, plan and options, so the same run opened again
        does not compile it again."""
        leaves, treedef = jax.tree.flatten(self.state())
        options = tuple(sorted(self.spec.compile_options("infer").items()))
        forwards: dict[int, Callable] = {}

        def logits(images):
            forward = forwards.get(images.shape[0])
            if forward is None:
                defs = self.inference_defs(images)
                forward = packed_flat_forward(defs, treedef, options, leaves, images)
                forwards[images.shape[0]] = forward
            return forward(leaves, images)

        return logits

    @functools.cached_property
    def eval_defs(self) -> ModelDefs:
        """The graph definitions of the run's eval step: on its ``eval_conv_plan`` when it
        has one (the plan its evaluations ran), else ``defs``."""
        return eval_defs(self.spec, self.model(), self.defs)

    @functools.cached_property
    def _defs_by_batch(self) -> dict:
        return {}

    def inference_defs(self, images, platform: str | None = None) -> ModelDefs:
        """The model's graph definitions for a forward on ``images`` (an array or
        ``ShapeDtypeStruct`` in the run's layout; its batch may be symbolic): the run's own,
        with the conv plan ``infer.plan.inference_plan`` gives for that batch on
        ``platform`` (``"cpu"``, ``"cuda"``, ...; None: JAX's default backend; several
        joined by commas get no CPU rules). ``params``/``model_state`` fit them."""
        platform = default_backend() if platform is None else platform
        key = (images.shape[0], platform)
        defs = self._defs_by_batch.get(key)
        if defs is None:
            planned = planned_model(self.spec, self.model(), images, table_cpu_kind(platform))
            defs = self.defs if planned is None else split_model(planned)[0]
            self._defs_by_batch[key] = defs
        return defs

    def model(self) -> nnx.Module:
        """The model in eval mode, in the run's layout and precision policy."""
        return nnx.merge(self.defs.eval, self.params, self.model_state)

    def state(self) -> TrainState:
        """What ``make_eval_step``/``make_forward`` read: params and model_state, no optimizer."""
        return TrainState(
            step=None,
            params=self.params,
            model_state=self.model_state,
            opt_state=None,
            loss_scale=None,
        )


@functools.lru_cache(maxsize=8)
def _flat_forward(defs: ModelDefs, treedef) -> Callable:
    forward = make_forward(defs)

    def flat(leaves, images):
        return forward(jax.tree.unflatten(treedef, leaves), images)

    return flat


@functools.lru_cache(maxsize=8)
def jitted_flat_forward(defs: ModelDefs, treedef, options: tuple, keys: tuple = ()) -> Callable:
    """The jitted ``(leaves, images) -> logits`` of ``defs``; with ``keys`` (the
    ``PackedKernels.keys`` of its oneDNN convs) ``(blobs, leaves, images) -> logits``."""
    flat = _flat_forward(defs, treedef)
    if keys:
        flat = with_packed_kernels(flat, keys)
    return jax.jit(flat, compiler_options=dict(options) or None)


def packed_flat_forward(defs: ModelDefs, treedef, options: tuple, leaves, images) -> Callable:
    """``(leaves, images) -> logits`` for ``leaves`` (fixed) at ``images``' shape, its oneDNN
    convs reading kernels packed once here (``nn.conv_algos.onednn_packed``, the same bits):
    a forward called again and again on one state reorders no kernel per call."""
    packed = pack_kernels(_flat_forward(defs, treedef), leaves, images)
    if not packed.blobs:
        return jitted_flat_forward(defs, treedef, options)
    forward = jitted_flat_forward(defs, treedef, options, packed.keys)
    return functools.partial(forward, packed.blobs)


def class_names(dataset: Dataset) -> list[str]:
    """The data set's class names, or the class numbers as text when it has none."""
    names = dataset.class_names
    return list(names) if names else [str(i) for i in range(dataset.num_classes)]


def read_config(workdir: Path) -> TrainConfig:
    if workdir.exists() and not workdir.is_dir():
        raise NoRunError(
            f"Workdir {workdir} is a file, not a run's directory; pass the --workdir of a "
            "`layoutlab train` run (the directory that holds its config.json)."
        )
    if not workdir.is_dir():
        raise NoRunError(
            f"Workdir {workdir} does not exist; pass the --workdir of a `layoutlab train` run."
        )
    path = workdir / CONFIG_FILE
    if not path.is_file():
        raise NoRunError(
            f"{workdir} has no {CONFIG_FILE}, so it is not a training run's workdir; pass the "
            "--workdir of a `layoutlab train` run."
        )
    try:
        raw = json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"{path} is not valid JSON ({e}); restore it from the run.") from None
    return validate(TrainConfig.from_dict(raw), jax.device_count())


def _checkpoint_choice(step) -> int | str | None:
    """``step`` as ``open_run`` reads it: a step number, ``"best"`` (the ``keep_best``
    checkpoint) or None for the newest (``"latest"`` too); anything else is a ``ValueError``."""
    if step is None or step == "best":
        return step
    if step == "latest":
        return None
    if isinstance(step, str) and step.strip().isdigit():
        return int(step)
    if isinstance(step, int | np.integer) and not isinstance(step, bool) and step >= 0:
        return int(step)
    raise ValueError(
        f"checkpoint {step!r} is not a step number, 'latest' or 'best'; pass one of those."
    )


def _read_best(workdir: Path, run_id: str | None) -> tuple[dict, dict, Path]:
    directory = workdir / BEST_DIR
    try:
        arrays, meta = read_checkpoint(directory, None, run_id=run_id)
    except FileNotFoundError:
        raise NoRunError(
            f"{workdir} has no best checkpoint: the run kept none (train with --keep-best "
            "METRIC, e.g. val_accuracy), or none was saved yet; pass a step number or leave out "
            "--checkpoint for the newest."
        ) from None
    return arrays, meta, directory


def _read(workdir: Path, step: int | str | None, run_id: str | None) -> tuple[dict, dict, Path]:
    """A certified step of this run (``run_id``, None for a run from before run ids: any
    run's) that is the step its directory names, and the directory it is in."""
    if step == "best":
        return _read_best(workdir, run_id)
    directory = workdir / CHECKPOINT_DIR
    try:
        return (*read_checkpoint(directory, step, run_id=run_id), directory)
    except ForeignCheckpointError as e:  # only for an asked step: the newest falls back
        raise ForeignCheckpointError(
            f"{e} Pick another step (or leave out --checkpoint for the run's newest own one)."
        ) from None
    except FileNotFoundError as e:
        if step is not None and directory.is_dir():
            raise NoRunError(f"{e} Pick one of those steps (or leave out --checkpoint).") from None
        raise NoRunError(
            f"{workdir} has no checkpoint ({e}); train first (`layoutlab train --workdir "
            f"{workdir} --resume` continues the run) or pass another --workdir."
        ) from None


def checkpoint_state(
    arrays: dict[str, np.ndarray],
    meta: dict,
    params: nnx.State,
    model_state: nnx.State,
    where: str,
    prefix: str = "",
) -> tuple[nnx.State, nnx.State]:
    """``(params, model_state)`` with the values of a checkpoint's ``TrainState`` arrays.

    ``params``/``model_state`` may be abstract (from ``nnx.eval_shape``); their leaves name the
    shapes and dtypes wanted. Checkpoint paths are ``TrainState`` key paths
    (``.params['classifier']...``); PRNG keys are stored as key data and wrapped again. A
    missing array or one of another shape or dtype raises ``IncompatibleCheckpointError``.
    ``prefix``: where in the ``TrainState`` they are (``".ema"``: the moving average's).
    """
    impls = meta.get("key_impls", {})
    model = meta.get("extra", {}).get("config", {}).get("model", "another model")

    def value(prefix: str):
        def fill(path, want):
            name = prefix + jax.tree_util.keystr(path)
            if name not in arrays:
                raise IncompatibleCheckpointError(
                    f"Checkpoint {where} has no {name} (it was written by {model}); use the "
                    "workdir of the run that wrote it."
                )
            got = arrays[name]
            is_key = jax.dtypes.issubdtype(want.dtype, jax.dtypes.prng_key)
            want_shape = jax.eval_shape(jax.random.key_data, want).shape if is_key else want.shape
            want_dtype = np.dtype(np.uint32) if is_key else np.dtype(want.dtype)
            if got.shape != tuple(want_shape) or got.dtype != want_dtype:
                raise IncompatibleCheckpointError(
                    f"Checkpoint {where} holds {name} as {got.dtype}{list(got.shape)} where the "
                    f"run's config.json builds {want_dtype}{list(want_shape)}: it was written by "
                    f"{model}; use the workdir of the run that wrote it."
                )
            if is_key:
                return jax.random.wrap_key_data(jnp.asarray(got), impl=impls.get(name))
            return jnp.asarray(got)

        return fill

    params = jax.tree_util.tree_map_with_path(value(prefix + ".params"), params)
    model_state = jax.tree_util.tree_map_with_path(value(prefix + ".model_state"), model_state)
    return params, model_state


def open_run(
    workdir: str | Path,
    step: int | str | None = None,
    *,
    data: str | None = None,
    weights: str = "raw",
) -> Run:
    """The run in ``workdir`` restored from checkpoint ``step``: a step number, ``"best"``
    (the ``keep_best`` checkpoint, in ``<workdir>/best``) or None/``"latest"`` (the newest),
    with its ``weights`` (``WEIGHTS``: ``"ema"``, the moving average of a run trained with
    ``ema_decay``).

    ``data`` replaces the run's data source (it must have the run's image shape and classes).
    Raises ``NoRunError`` (a ``FileNotFoundError``) for a missing workdir, config or
    checkpoint, and ``ValueError`` for a checkpoint of another model or mismatched data.
    """
    workdir = Path(workdir)
    step = _checkpoint_choice(step)
    # The record with any field it lacks (a run from before that field) filled in, as
    # train_and_evaluate resolves it.
    spec = resolve_spec(read_config(workdir), num_devices=jax.device_count())
    config = spec.config
    _check_weights(weights, config, workdir)
    arrays, meta, directory = _read(workdir, step, config.run_id)
    dataset = load_run_data(config)  # as train_and_evaluate loads it
    if data is not None:
        dataset = _other_data(data, dataset, config)
    inputs = InputSpec.of(dataset, spec.batch_size)
    abstract = nnx.eval_shape(lambda: build_model(spec, inputs))  # train's builder
    defs, params, model_state = split_model(abstract)
    where = str(directory / str(meta["step"]))
    _check_writer(meta, config, where)
    prefix = ".ema" if weights == "ema" else ""
    params, model_state = checkpoint_state(arrays, meta, params, model_state, where, prefix)
    return Run(workdir, config, dataset, int(meta["step"]), defs, params, model_state)


def _check_weights(weights: str, config: TrainConfig, workdir: Path) -> None:
    if weights not in WEIGHTS:
        raise ValueError(f"Unknown weights {weights!r}; use one of: {', '.join(WEIGHTS)}.")
    if weights == "ema" and not config.ema_decay:
        raise ValueError(
            f"{workdir} was trained without a moving average of its weights (its config.json "
            "sets no ema_decay); use --weights raw, or train with --ema-decay D."
        )


# Config fields that decide the arrays' meaning; kernel_storage can transpose square kernels
# without changing a shape, so the shape check alone would miss it.
_MODEL_FIELDS = ("model", "model_kwargs", "layout", "kernel_storage", "activation_storage")


def _check_writer(meta: dict, config: TrainConfig, where: str) -> None:
    """The checkpoint's own config (when it has one) must build the model config.json does."""
    saved = meta.get("extra", {}).get("config")
    if not isinstance(saved, dict):
        return  # older or foreign checkpoints: checkpoint_state still checks every array
    defaults = TrainConfig()
    saved = with_legacy_defaults(saved)  # a checkpoint from before a field existed
    for field in _MODEL_FIELDS:
        have = saved.get(field, getattr(defaults, field))
        want = getattr(config, field)
        if have != want:
            raise IncompatibleCheckpointError(
                f"Checkpoint {where} was written with {field}={have!r} but the run's "
                f"config.json has {field}={want!r}: it belongs to another run; use that run's "
                "workdir (or its config.json)."
            )


def _other_data(source: str, run_data: Dataset, config: TrainConfig) -> Dataset:
    other = load_run_data(dataclasses.replace(config, data=source))  # resized as the run was
    if (other.image_shape, other.num_classes) != (run_data.image_shape, run_data.num_classes):
        raise ValueError(
            f"--data {source} has images {other.image_shape} (HxWxC) and {other.num_classes} "
            f"classes, the run was trained on {run_data.image_shape} and "
            f"{run_data.num_classes}; pass a data set of the run's shape and classes."
        )
    return other


def load_model(
    workdir: str | Path,
    step: int | str | None = None,
    *,
    layout=None,
    batch_size: int | None = None,
    weights: str = "raw",
) -> nnx.Module:
    """The model trained in ``workdir``, restored from checkpoint ``step`` (a step number,
    ``"best"``: the ``keep_best`` checkpoint, or None/``"latest"``: the newest), in eval mode
    and ready to call on normalized images.

    It runs in the run's layout and precision policy, or in ``layout`` (``"NHWC"``/``"NCHW"``,
    converted with ``layoutlab.convert_layout``). Its ``"auto"`` convs carry the run's conv
    plan, whose entries match the training batch's shapes only; ``batch_size`` plans them for
    calls on that many images instead, as ``predict`` does (``infer.plan.planned_model``).
    ``weights="ema"``: the moving average of a run trained with ``ema_decay``.
    Raises ``FileNotFoundError`` (``NoRunError``) when the workdir, its config.json or the
    checkpoint is missing, and ``ValueError`` when the checkpoint was written by another
    model or ``batch_size`` is not a positive integer.
    """
    if batch_size is not None and (
        isinstance(batch_size, bool)
        or not isinstance(batch_size, int | np.integer)
        or batch_size < 1
    ):
        raise ValueError(
            f"batch_size must be a positive integer (the number of images per call), got "
            f"{batch_size!r}."
        )
    run = open_run(workdir, step, weights=weights)
    model = run.model()
    if layout is not None:
        from layoutlab.nn.convert import convert_layout

        model = convert_layout(model, layout)
    if batch_size is not None:
        h, w, c = run.dataset.image_shape
        images = jax.ShapeDtypeStruct(model.layout.shape(int(batch_size), c, (h, w)), np.float32)
        planned = planned_model(run.spec, model, images, table_cpu_kind(default_backend()))
        model = model if planned is None else planned
    return model
