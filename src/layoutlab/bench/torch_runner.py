"""Runs one configuration in PyTorch: the mirror of a registry model with the same weights.

PyTorch is an optional extra and is imported only when a torch configuration runs.
Memory formats: ``contiguous`` (NCHW) and ``channels_last`` (NHWC in memory). Precisions:
``fp32``, and ``torch.autocast`` with bfloat16 (``amp_bf16``, CPU and GPU) or float16
(``amp_fp16``, GPU; training then uses ``torch.amp.GradScaler``). Training is forward,
cross-entropy, backward and an SGD-with-momentum step, the update layoutlab's "pytorch" step
makes (``bench --torch`` runs it). ``torch.set_num_threads`` is left at PyTorch's default
and recorded in ``threads``.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np

from layoutlab.bench.cases import TorchCase
from layoutlab.bench.machine import cpu_model
from layoutlab.bench.memory import peak_rss_bytes
from layoutlab.bench.timing import timed

__all__ = [
    "TorchRunner",
    "TorchUnavailable",
    "build_torch_model",
    "compiled_model",
    "require_torch",
    "torch_device",
    "torch_precisions",
]

_LR, _MOMENTUM = 0.01, 0.9  # as layoutlab.train.spec's "pytorch" optimizer (bench --torch)
_RECOMPILE_LIMIT = 1024  # torch.compile cases one process may hold (see ``compiled_model``)


class TorchUnavailable(ImportError):
    """PyTorch (the optional ``torch`` extra) is not installed."""


def require_torch():
    """The ``torch`` module, or ``TorchUnavailable`` saying how to install it."""
    try:
        import torch
    except ImportError as err:
        raise TorchUnavailable(
            "PyTorch is not installed, so the PyTorch side-by-side runs were skipped "
            "(the layoutlab runs are unaffected). Install the extra with "
            "`pip install 'layoutlab[torch]'` to compare against PyTorch."
        ) from err
    return torch


def torch_device(platform: str) -> str:
    """The PyTorch device for a jax platform: ``"cuda"`` for ``"gpu"``, else ``"cpu"``."""
    if platform != "gpu":
        return "cpu"
    torch = require_torch()
    if not torch.cuda.is_available():
        raise RuntimeError(
            "The benchmark runs on GPU but this PyTorch build has no CUDA; install a CUDA "
            "build of torch, or run without --torch."
        )
    return "cuda"


def torch_precisions(device: str, precision_class: str) -> tuple[str, ...]:
    """PyTorch precisions of a class: fp32, or autocast bf16 (+ fp16 on GPU) for half."""
    if precision_class == "fp32":
        return ("fp32",)
    return ("amp_fp16", "amp_bf16") if device == "cuda" else ("amp_bf16",)


def build_torch_model(case: TorchCase, seed: int = 0):
    """The PyTorch mirror of ``case``'s model, loaded with the layoutlab model's weights
    (built with the same seed, so both frameworks start from the same parameters)."""
    from layoutlab.compare.torch_mirrors import build_torch_mirror

    w = case.workload
    kwargs = {"in_channels": w.channels, **w.kwargs}
    module = build_torch_mirror(w.model, num_classes=w.num_classes, **kwargs)
    # load_state_dict copies, so the cached tensors are never written through a module.
    module.load_state_dict(
        _layoutlab_weights(w.model, w.num_classes, w.model_kwargs, w.channels, seed)
    )
    return module


@functools.lru_cache(maxsize=1)
def _layoutlab_weights(model: str, num_classes: int, items: tuple, channels: int, seed: int):
    """The layoutlab model's initial weights as a torch state dict. Every torch row of one
    workload (layouts, memory formats, batch sizes, modes, torch.compile) starts from these,
    so a sweep builds the model once per workload instead of once per row; one entry,
    because a sweep takes its workloads one after another."""
    from flax import nnx

    from layoutlab import models
    from layoutlab.compare.torch_weights import to_torch_state_dict

    kwargs = {"in_channels": channels, **dict(items)}
    jax_model = models.create(
        model, num_classes=num_classes, layout="NHWC", rngs=nnx.Rngs(seed), **kwargs
    )
    return to_torch_state_dict(jax_model, tensors=True)


def torch_tf32(torch, device: str) -> str:
    """Whether PyTorch runs float32 convs/matmuls in TensorFloat32 here (its defaults:
    cuDNN convs yes, matmuls no); ``n/a`` off CUDA."""
    if device != "cuda":
        return "n/a"
    conv = "on" if torch.backends.cudnn.allow_tf32 else "off"
    matmul = "on" if torch.backends.cuda.matmul.allow_tf32 else "off"
    return f"conv {conv}, matmul {matmul}"


def compiled_model(torch, model, **compile_kwargs):
    """``torch.compile(model)`` that stays compiled for a whole sweep.

    Dynamo caches graphs per code object, and each case (model instance, batch, mode) adds
    one: past ``recompile_limit`` (8) it silently runs eager, so a sweep's ninth
    torch.compile case would be timed as eager under torch.compile's name. The limit is
    raised, and reaching it is an error rather than a mislabelled row."""
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, _RECOMPILE_LIMIT)
    config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, _RECOMPILE_LIMIT)
    config.fail_on_recompile_limit_hit = True
    return torch.compile(model, **compile_kwargs)


class TorchRunner:
    """Same protocol as ``JaxRunner``: ``setup``, ``step``, ``finish``, ``close``."""

    def __init__(self, case: TorchCase, *, device: str = "cpu", seed: int = 0):
        self.case, self.device, self.seed = case, device, seed
        self._state = None

    def row(self) -> dict:
        return self.case.row()

    def _memory_format(self, torch):
        if self.case.memory_format == "contiguous":
            return torch.contiguous_format
        if self.case.memory_format != "channels_last":
            raise ValueError(
                f"Unknown memory format {self.case.memory_format!r}; "
                "use 'contiguous' or 'channels_last'."
            )
        return (
            torch.channels_last
            if len(self.case.workload.spatial) == 2
            else (torch.channels_last_3d)
        )

    def setup(self) -> dict:
        torch = require_torch()
        if self.device == "cuda":
            # PyTorch's own advice for fixed shapes, and what layoutlab's side gets from
            # XLA's conv autotuning: cuDNN picks its fastest algorithm per shape.
            torch.backends.cudnn.benchmark = True
        case, w = self.case, self.case.workload
        fmt = self._memory_format(torch)
        model = build_torch_model(case, self.seed).to(self.device, memory_format=fmt)
        images = np.moveaxis(w.images_channels_last(self.seed), -1, 1)
        x = torch.from_numpy(np.ascontiguousarray(images)).to(self.device)
        x = x.contiguous(memory_format=fmt)
        y = torch.from_numpy(w.labels(self.seed)).long().to(self.device)
        amp = {"fp32": None, "amp_bf16": torch.bfloat16, "amp_fp16": torch.float16}
        if case.precision not in amp:
            raise ValueError(f"Unknown PyTorch precision {case.precision!r}; use {list(amp)}.")
        train = w.mode == "train"
        model.train(train)
        opt = torch.optim.SGD(model.parameters(), lr=_LR, momentum=_MOMENTUM) if train else None
        use_scaler = train and case.precision == "amp_fp16"
        scaler = torch.amp.GradScaler(self.device) if use_scaler else None
        runnable = compiled_model(torch, model) if case.compile else model
        self._state = (torch, runnable, x, y, opt, scaler, amp[case.precision])
        if self.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        # torch.compile compiles on the first call: that call is the compile time. Its
        # internals emit deprecation warnings that say nothing about this run.
        compile_s = None
        if case.compile:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                warnings.simplefilter("ignore", FutureWarning)
                compile_s = timed(self.step)
        kind = torch.cuda.get_device_name() if self.device == "cuda" else cpu_model()
        return {
            "compile_s": compile_s,
            "backend": self.device,
            "device_kind": kind,
            "threads": torch.get_num_threads(),
            "tf32": torch_tf32(torch, self.device),
        }

    def step(self) -> None:
        torch, model, x, y, opt, scaler, dtype = self._state
        autocast = torch.autocast(self.device, dtype=dtype, enabled=dtype is not None)
        if opt is None:
            with torch.inference_mode(), autocast:
                model(x)
        else:
            opt.zero_grad(set_to_none=True)
            with autocast:
                loss = torch.nn.functional.cross_entropy(model(x).float(), y)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
        if self.device == "cuda":
            torch.cuda.synchronize()

    def finish(self) -> dict:
        torch = self._state[0] if self._state else None
        device_peak = None
        if torch is not None and self.device == "cuda":
            device_peak = int(torch.cuda.max_memory_allocated())
        return {"device_peak_bytes": device_peak, "peak_rss_bytes": peak_rss_bytes()}

    def close(self) -> None:
        self._state = None
