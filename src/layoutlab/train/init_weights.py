"""``train --init PATH``: a run that starts from existing weights.

The weights come as a PyTorch ``state_dict`` with torchvision's names: read from a
``.pth``/``.pt`` file, or exported from another layoutlab run's newest checkpoint
(``models.torch_weights.to_torch_state_dict`` of the model its ``config.json`` builds). One
path for both: the names and PyTorch's orders are layout-free, so a run of either layout
starts from weights of either layout, and the conversion is ``models.torch_weights``'.

The classifier head is the parameters whose shapes follow the class count (``head_keys``:
the model built for the data's classes and for one more, compared); when its shapes in the
weights differ from the data's it is left at its fresh initialization, said in one line.
Any other mismatch is an error. What the weights were read from (``fingerprint``) goes into
``config.json``, and a resume compares it (``init_change``), as it does the data's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from layoutlab.models.torch_weights import (
    TORCH_MISSING,
    StateDictKeyError,
    StateDictShapeError,
    read_state_dict,
    to_torch_state_dict,
    torch_shapes,
    torch_values,
)
from layoutlab.train.config import TrainConfig
from layoutlab.train.spec import InputSpec, RunSpec

__all__ = [
    "InitWeights",
    "head_keys",
    "init_change",
    "initial_values",
    "read_init",
    "run_values",
    "with_init_weights",
]

_CHUNK = 1 << 20


@dataclasses.dataclass(frozen=True)
class InitWeights:
    """Weights to start from: ``state_dict`` (NumPy arrays by torchvision-style name), the
    absolute ``path`` read and its ``fingerprint``."""

    path: str
    state_dict: dict
    fingerprint: dict


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _arrays_sha256(arrays: dict) -> str:
    digest = hashlib.sha256()
    for name in sorted(arrays):
        value = np.ascontiguousarray(arrays[name])
        digest.update(f"{name}:{value.dtype.str}:{value.shape};".encode())
        digest.update(value.tobytes())
    return digest.hexdigest()


def read_init(path: str) -> InitWeights:
    """The weights at ``path`` (a state dict file or a run's workdir); ``ValueError`` (one
    sentence with the fix) when there are none to read, or a ``.pth`` without torch."""
    where = Path(path).expanduser().absolute()
    if where.is_dir():
        return _read_run(where)
    if not where.is_file():
        raise ValueError(
            f"init {path!r}: no such file or directory; pass a PyTorch state dict (.pth/.pt) "
            "or a layoutlab run's workdir."
        )
    sha256 = _file_sha256(where)
    try:
        state_dict = read_state_dict(where)
    except ImportError:
        raise ValueError(f"init {path!r} is read with PyTorch: {TORCH_MISSING}.") from None
    except ValueError as e:
        raise ValueError(
            f"init: {e} Pass a file saved with torch.save(model.state_dict())."
        ) from None
    return InitWeights(str(where), state_dict, {"sha256": sha256})


def _read_run(workdir: Path) -> InitWeights:
    """The newest certified checkpoint of the run in ``workdir`` as a torch-named state
    dict: the model its ``config.json`` builds, filled with the checkpoint's arrays (their
    own shapes: the run's classes and channels), exported."""
    from layoutlab.train.checkpoint import read_checkpoint
    from layoutlab.train.metrics import CHECKPOINT_DIR, CONFIG_FILE
    from layoutlab.train.program import build_model
    from layoutlab.train.spec import resolve_spec
    from layoutlab.train.state import split_model

    try:
        config = TrainConfig.from_dict(json.loads((workdir / CONFIG_FILE).read_text()))
    except (OSError, ValueError) as e:
        raise ValueError(
            f"init {workdir}: not a layoutlab run's workdir (its {CONFIG_FILE} does not read: "
            f"{e}); pass a run's workdir or a .pth/.pt state dict."
        ) from None
    try:
        arrays, meta = read_checkpoint(workdir / CHECKPOINT_DIR, run_id=config.run_id)
    except FileNotFoundError:
        raise ValueError(
            f"init {workdir}: the run has no checkpoint to start from; train it first (or "
            "--resume it), or pass another run or a .pth/.pt state dict."
        ) from None
    spec = resolve_spec(config)
    # The layers and their layouts are what the export reads; the shapes are the arrays'.
    inputs = InputSpec((32, 32, 3), 2, 1)
    defs, params, model_state = split_model(nnx.eval_shape(lambda: build_model(spec, inputs)))

    def fill(prefix):
        def value(path, _):
            name = prefix + jax.tree_util.keystr(path)
            if name not in arrays:
                raise ValueError(
                    f"init {workdir}: its checkpoint has no {name}, which its config.json's "
                    f"{config.model} holds; pass the workdir the checkpoint belongs to."
                )
            return arrays[name]

        return value

    params = jax.tree_util.tree_map_with_path(fill(".params"), params)
    model_state = jax.tree_util.tree_map_with_path(fill(".model_state"), model_state)
    model = nnx.merge(defs.train, params, model_state)
    step = int(meta["step"])
    fingerprint = {"run_id": config.run_id, "step": step, "sha256": _arrays_sha256(arrays)}
    return InitWeights(str(workdir), to_torch_state_dict(model), fingerprint)


def with_init_weights(config: TrainConfig) -> tuple[TrainConfig, InitWeights | None]:
    """``config`` recording what its init weights were read from now (a value it carried, a
    config.json given to ``--config``, is replaced; ``init`` as an absolute path), and the
    weights read (None without ``init``)."""
    if config.init is None:
        return dataclasses.replace(config, init_fingerprint=None), None
    weights = read_init(config.init)
    fields = {"init": weights.path, "init_fingerprint": weights.fingerprint}
    return dataclasses.replace(config, **fields), weights


def init_change(config: TrainConfig, recorded: dict | None, have: dict | None) -> str | None:
    """None when the init weights read now (``have``) are those the run started from
    (``recorded``), else one sentence naming the change and the fix."""
    if recorded == have:
        return None
    if recorded is None:
        what = f"it started from a fresh initialization, not from {config.init!r}"
    elif have is None:
        what = "it started from init weights that this resume does not name"
    elif recorded.get("run_id") is not None and recorded.get("step") != have.get("step"):
        what = f"the run {config.init!r} was at step {recorded.get('step')}, now {have.get('step')}"
    else:
        what = f"{config.init!r} has other contents (sha256) than when the run started"
    return (
        f"The init weights are not those the run started from ({what}). Restore them, or "
        "start a new workdir from the new weights."
    )


def head_keys(spec: RunSpec, inputs: InputSpec, model: nnx.Module) -> dict[str, tuple]:
    """``{key: shape}`` of the ``state_dict`` keys of the classifier head of ``model`` (the
    run's abstract model): those whose shape changes with one class more."""
    from layoutlab.train.program import build_model

    more = dataclasses.replace(inputs, num_classes=inputs.num_classes + 1)
    other = torch_shapes(nnx.eval_shape(lambda: build_model(spec, more)))
    return {k: shape for k, shape in torch_shapes(model).items() if other.get(k) != shape}


def _classes(state_dict: dict, head: dict[str, tuple], num_classes: int) -> int | None:
    """The class count of the weights' head: the length of the axis that follows the
    classes, where it differs."""
    for key, shape in head.items():
        got = np.shape(state_dict.get(key))
        for axis, size in enumerate(shape):
            if size == num_classes and axis < len(got) and got[axis] != size:
                return int(got[axis])
    return None


def initial_values(
    spec: RunSpec,
    inputs: InputSpec,
    model: nnx.Module,
    weights: InitWeights,
    log: Callable[[str], None],
) -> dict[str, np.ndarray]:
    """The init weights converted for ``model`` (the run's abstract model), by state dict
    key (``models.torch_weights.assign_torch_values`` sets them); a head of another class
    count is left out (re-initialized) with one line on ``log``. ``ValueError`` for any other
    missing, unknown or mis-shaped key."""
    head = head_keys(spec, inputs, model)
    try:
        values, left_out = torch_values(model, weights.state_dict, replaceable=frozenset(head))
    except (StateDictKeyError, StateDictShapeError) as e:
        raise ValueError(
            f"init {weights.path} does not fit {spec.config.model} with model_kwargs "
            f"{dict(spec.config.model_kwargs)}: {e}"
        ) from None
    if left_out:
        layers = sorted({k.rsplit(".", 1)[0] for k in left_out})
        old = _classes(weights.state_dict, head, inputs.num_classes)
        was = "another count of" if old is None else str(old)
        log(
            f"note: classifier head {', '.join(layers)} re-initialized for the data's classes "
            f"({was} -> {inputs.num_classes} classes; the init weights' head is not used)."
        )
    return values


def run_values(
    spec: RunSpec, dataset, model: nnx.Module, weights: InitWeights | None, *, announce: bool
) -> dict[str, np.ndarray] | None:
    """``initial_values`` for a run on ``dataset`` (None without init weights); the head's
    note goes to stderr on process 0 when ``announce`` (a run starting, not resuming)."""
    if weights is None:
        return None
    say = announce and jax.process_index() == 0
    log = (lambda m: print(m, file=sys.stderr)) if say else (lambda m: None)
    return initial_values(spec, InputSpec.of(dataset, spec.batch_size), model, weights, log)
