"""``export_run``: a run's model as serialized StableHLO (``jax.export``) plus a JSON sidecar.

The artifact is the eval-mode forward with the weights baked in as constants: it maps
normalized images in the run's layout (float32) to logits, and needs only JAX to run::

    exported = jax.export.deserialize(open("model.jax", "rb").read())
    logits = exported.call(images)

The batch dimension is symbolic by default, so one artifact serves any batch size. Every
conv runs XLA's own convolution in it where the run's plan names an algorithm that calls
kernels outside XLA (``onednn``): those exist only where layoutlab registered them. The
sidecar (``<out>.json``) says what the input must be: shape, layout, dtype, and the
normalization that turns pixels into it (``(pixels / 255 - mean) / std`` per channel).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

from layoutlab.infer.load import Run, class_names
from layoutlab.layout import parse_layout
from layoutlab.nn.configuration import without_custom_calls
from layoutlab.train.state import split_model
from layoutlab.train.steps import make_forward

__all__ = [
    "PLATFORMS",
    "export_run",
    "layoutlab_targets",
    "parse_batch",
    "parse_platforms",
    "sidecar_path",
]

PLATFORMS = ("cpu", "cuda", "rocm", "tpu")
SYMBOLIC = "symbolic"


def parse_platforms(text: str) -> tuple[str, ...]:
    names = tuple(p.strip().lower() for p in text.split(",") if p.strip())
    unknown = [p for p in names if p not in PLATFORMS]
    if not names or unknown:
        raise ValueError(
            f"--platforms {text!r}: {', '.join(unknown) or 'none given'} is not a platform; "
            f"use a comma-separated list of {', '.join(PLATFORMS)}."
        )
    return names


def parse_batch(text: str | int) -> int | None:
    """``"symbolic"`` -> ``None`` (any batch size), else a positive batch size."""
    if str(text).strip().lower() == SYMBOLIC:
        return None
    try:
        batch = int(text)
    except ValueError:
        batch = 0
    if batch < 1:
        raise ValueError(f"--batch-size {text!r} is neither a positive integer nor '{SYMBOLIC}'.")
    return batch


def sidecar_path(out: str | Path) -> Path:
    out = Path(out)
    return out.with_name(out.name + ".json")


# Every custom-call target layoutlab registers starts with this (oneDNN's: "layoutlab_onednn_").
_TARGET = re.compile(
    r"(?:custom_call\s*@|call_target_name\s*=\s*\"|custom_call_target=\")(layoutlab_\w+)"
)


def layoutlab_targets(module_text: str) -> set[str]:
    """The custom-call targets of layoutlab's own kernels in a StableHLO or HLO module's text."""
    return set(_TARGET.findall(module_text))


def _portable_defs(run: Run, defs):
    """``defs`` with XLA's conv wherever they run an algorithm that makes custom calls."""
    model = nnx.merge(defs.eval, run.params, run.model_state)
    portable = without_custom_calls(model)
    return defs if portable is model else split_model(portable)[0]


def _input_shape(run: Run, batch) -> tuple:
    h, w, c = run.dataset.image_shape
    channels_last = parse_layout(run.config.layout).is_channels_last
    return (batch, h, w, c) if channels_last else (batch, c, h, w)


def export_run(
    run: Run,
    out: str | Path,
    *,
    platforms: tuple[str, ...] = ("cpu",),
    batch: int | None = None,
) -> tuple[Path, Path]:
    """Writes ``out`` (serialized ``jax.export.Exported``) and its sidecar; returns both paths.

    ``batch=None`` exports a symbolic batch dimension ``b``; an int fixes it.
    """
    out = Path(out)
    if not out.parent.is_dir():  # a typo in the path should not create folders
        raise ValueError(
            f"--out's folder {out.parent} does not exist; create it first or pick another --out."
        )
    state = run.state()
    dim = jax.export.symbolic_shape("b")[0] if batch is None else batch
    # Float32 like the data loaders' batches; the model casts them per its policy.
    spec = jax.ShapeDtypeStruct(_input_shape(run, dim), jnp.float32)
    # The conv plan for this batch on the target platform; several platforms share one
    # program, so the CPU table's rules do not apply to them.
    forward = make_forward(_portable_defs(run, run.inference_defs(spec, ",".join(platforms))))
    try:
        exported = jax.export.export(
            jax.jit(lambda images: forward(state, images)), platforms=platforms
        )(spec)
        foreign = layoutlab_targets(exported.mlir_module())
    except Exception as e:  # lowering errors come in several types; all mean one thing here
        foreign = layoutlab_targets(str(e))
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if not foreign:
            raise ValueError(
                f"Exporting {run.config.model} for {', '.join(platforms)} failed: {first}; "
                "try --platforms cpu or a fixed --batch N."
            ) from None
    if foreign:  # an algorithm that calls its own kernels without saying so (custom_calls)
        raise ValueError(
            f"Exporting {run.config.model} would leave calls to layoutlab's own kernels "
            f"({', '.join(sorted(foreign))}) in an artifact meant to load without layoutlab; "
            "the conv algorithm making them must declare Algorithm.custom_calls (a bug to report)."
        )
    out.write_bytes(exported.serialize())
    out_aval = exported.out_avals[0]
    sidecar = {
        "format": "jax.export serialized StableHLO; "
        "jax.export.deserialize(bytes).call(images) -> logits",
        "model": run.config.model,
        "workdir": str(run.workdir),
        "step": run.step,
        "platforms": list(exported.platforms),
        "input": {
            "shape": list(_input_shape(run, SYMBOLIC if batch is None else batch)),
            "layout": str(parse_layout(run.config.layout)),
            "dtype": "float32",
        },
        "output": {
            "shape": [SYMBOLIC if batch is None else batch, run.dataset.num_classes],
            "dtype": str(out_aval.dtype),
            "meaning": "logits",
        },
        "normalization": {
            "formula": "(pixels / 255 - mean) / std, per channel",
            "mean": list(run.dataset.mean),
            "std": [s if s > 0 else 1.0 for s in run.dataset.std],  # as make_dataset
            "channels": "grayscale" if run.dataset.num_channels == 1 else "RGB",
        },
        "class_names": class_names(run.dataset),
    }
    side = sidecar_path(out)
    side.write_text(json.dumps(sidecar, indent=1) + "\n")
    return out, side
