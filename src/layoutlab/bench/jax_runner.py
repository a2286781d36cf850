"""Runs one layoutlab configuration: build the model, compile its step, time calls."""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from layoutlab import models
from layoutlab.bench.cases import JaxCase
from layoutlab.bench.memory import device_peak_bytes, peak_rss_bytes
from layoutlab.bench.timing import JaxStep
from layoutlab.bench.tuning.conv_reference import effective_compute_dtype
from layoutlab.nn.conv_algos import AUTO
from layoutlab.nn.conv_algos.onednn_packed import pack_kernels, with_packed_kernels
from layoutlab.train import program as programs
from layoutlab.train.spec import InputSpec, RunSpec, resolve_spec
from layoutlab.xla.backends import resolve_backend

__all__ = ["JaxRunner", "case_model", "case_spec", "layout_images", "tune_convs"]


def layout_images(images_channels_last: np.ndarray, layout: str) -> np.ndarray:
    """Channels-last images moved into ``layout`` (a copy; the values are unchanged)."""
    lay = models.resolve_layout(layout, images_channels_last.ndim - 2)
    if lay.is_channels_last:
        return images_channels_last
    return np.ascontiguousarray(np.moveaxis(images_channels_last, -1, 1))


def case_spec(
    case: JaxCase, seed: int | None = None, total_steps: int | None = None
) -> tuple[RunSpec, InputSpec]:
    """The ``RunSpec`` and ``InputSpec`` of ``case``: its run resolved as ``layoutlab train``
    resolves a config (so its optimizer and loss-scale rule), with ``seed`` (None: the run's)
    and a learning-rate schedule over ``total_steps`` (None: ``train.spec.SCHEDULE_STEPS``)."""
    w = case.workload
    config = case.run if seed is None else dataclasses.replace(case.run, seed=seed)
    inputs = InputSpec.for_model(w.model, w.input_shape, w.num_classes, w.batch_size)
    return resolve_spec(config, total_steps), inputs


def case_model(case: JaxCase, seed: int | None = None) -> nnx.Module:
    """The case's model with its conv settings: ``train.program.build_model`` (the one
    ``build_model``) of ``case_spec``; the same ``seed`` gives the same weights in every layout.
    ``conv_algo="auto"`` convs run XLA's conv until given a plan (``tune_convs``)."""
    return programs.build_model(*case_spec(case, seed))


def tune_convs(
    model: nnx.Module,
    case: JaxCase,
    images,
    *,
    backend=None,
    repeats: int = 6,
    log=None,
    steps: int = 10,
):
    """The plan of every conv shape the case runs, for its mode and XLA options: from the
    autotune cache, a tuning (``case.conv_tune``; ``"auto"`` tunes only when it pays over
    ``steps`` steps) or the shipped table. Returns ``(plan, seconds it took, source)``."""
    from layoutlab.bench.tuning.plan_source import conv_plan_for_run

    t0 = time.perf_counter()
    found = conv_plan_for_run(
        model,
        images,
        steps=steps,
        objective="train" if case.workload.mode == "train" else "inference",
        tune=case.conv_tune,
        compiler_options=case.compiler_options,
        backend=backend,
        repeats=repeats,
    )
    seconds = time.perf_counter() - t0
    if log is not None:
        log(
            f"conv plan {case.layout} {case.precision} {case.workload.mode}: "
            f"{found.detail} ({seconds:.1f} s)"
        )
    return found.plan, seconds, found.source


class JaxRunner:
    """``setup()`` compiles (row fields out), ``step()`` runs one blocked step,
    ``finish()`` reports memory, ``close()`` frees the buffers."""

    def __init__(
        self,
        case: JaxCase,
        *,
        backend: str | None = None,
        seed: int | None = None,
        conv_tune_repeats: int = 6,
        log=None,
        steps: int = 10,
        pack_convs: bool = True,
    ):
        # None: the run's seed, which makes the weights, images and labels.
        self.case, self.backend = case, backend
        self.seed = case.run.seed if seed is None else seed
        self.steps = steps  # the steps the case will run: what a conv tuning must pay for
        self.conv_tune_repeats, self.log = conv_tune_repeats, log
        # Inference: oneDNN convs read kernels packed once (nn.conv_algos.onednn_packed).
        self.pack_convs, self.packed_kernels = pack_convs, 0
        self.step_fn: JaxStep | None = None
        self.spec: RunSpec | None = None  # what setup() built the step from

    def row(self) -> dict:
        return self.case.row()

    def prepare(self) -> tuple[float | None, str | None]:
        """Build the case's step (``self.step_fn``, not compiled yet) from its ``RunSpec``
        (``self.spec``); returns ``(conv tuning seconds, plan source)`` for ``"auto"``."""
        case, w = self.case, self.case.workload
        # The schedule spans the steps this case runs, as a train run's spans its own.
        spec, inputs = case_spec(case, self.seed, self.steps)
        # Planning needs the convs' shapes only; the weights are made by the program's init.
        model = nnx.eval_shape(lambda: programs.build_model(spec, inputs))
        images = jnp.asarray(layout_images(w.images_channels_last(self.seed), case.layout))
        tune_s = plan_source = None
        if case.conv_algo == AUTO:
            plan, tune_s, plan_source = tune_convs(
                model,
                case,
                images,
                backend=self.backend,
                repeats=self.conv_tune_repeats,
                log=self.log,
                steps=self.steps,
            )
            spec = spec.with_plan(plan)
        self.spec = spec
        program = programs.build_program(spec, inputs, resolve_backend(self.backend).platform)
        # One compiled init instead of an eager compile per initializer op.
        state = jax.jit(program.init, compiler_options=programs.INIT_COMPILER_OPTIONS)()
        name = f"{w.model}/{case.layout}/{case.precision}/{w.mode}/b{w.batch_size}"
        if w.mode == "train":
            labels = jnp.asarray(w.labels(self.seed))
            self.step_fn = JaxStep(
                program.train_step,
                (state, images, labels),
                donate_argnums=(0,),
                carry=0,
                backend=self.backend,
                name=name,
                compiler_options=spec.compile_options(w.mode) or None,
            )
        else:
            # Inference needs no optimizer state: leave it out of the arguments. Its leaves
            # go in flattened, as `predict` calls its forward (infer.load.Run.logits), since
            # flattening the nested state on every call slows a batch-1 step
            # (docs/performance/measurements.md#a-trained-runs-forward).
            leaves, treedef = jax.tree.flatten(state._replace(opt_state=None))

            def forward(leaves, images):
                return program.forward(jax.tree.unflatten(treedef, leaves), images)

            # oneDNN's convs read kernels packed once, as `predict` runs them (Run.logits).
            args = (leaves, images)
            packed = pack_kernels(forward, *args) if self.pack_convs else None
            self.packed_kernels = len(packed.blobs) if packed else 0
            if self.packed_kernels:
                forward = with_packed_kernels(forward, packed.keys)
                args = (packed.blobs, *args)
            self.step_fn = JaxStep(
                forward,
                args,
                backend=self.backend,
                name=name,
                compiler_options=spec.compile_options(w.mode) or None,
            )
        return tune_s, plan_source

    def setup(self) -> dict:
        tune_s, plan_source = self.prepare()
        fields = self.step_fn.compile()
        fields.pop("lower_s")
        fields.pop("alias_bytes")
        be = self.step_fn.backend
        # XLA on GPU runs float32 convs and matmuls in TensorFloat32 at JAX's default
        # precision (effective_compute_dtype says float16's rounding), so rows say so.
        tf32 = "n/a"
        if be.name == "gpu":
            tf32 = "on" if effective_compute_dtype(np.float32, "gpu") != np.float32 else "off"
        return {**fields, "backend": be.name, "device_kind": be.device_kind,
                "conv_tune_s": tune_s, "conv_plan_source": plan_source, "tf32": tf32,
                "packed_kernels": self.packed_kernels,
                "optimizer": self.spec.optimizer.label if self.case.workload.mode == "train"
                else None}  # fmt: skip

    def step(self) -> None:
        self.step_fn()

    def logits(self) -> np.ndarray | None:
        """The last inference step's output (None in train mode)."""
        if self.case.workload.mode != "infer" or self.step_fn.outputs is None:
            return None
        return np.asarray(self.step_fn.outputs.astype(jnp.float32))

    def finish(self) -> dict:
        device = self.step_fn.backend.device if self.step_fn else None
        return {
            "device_peak_bytes": device_peak_bytes(device) if device is not None else None,
            "peak_rss_bytes": peak_rss_bytes(),
        }

    def close(self) -> None:
        if self.step_fn is not None:
            self.step_fn.close()
