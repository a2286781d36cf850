"""What runs when no speed flag is given: the configuration measured fastest per backend.

On XLA:CPU a step gets

- the compile options of ``cpu_fast_options(mode)`` (convs on Eigen, dots on YNNPACK; in
  training also reductions and elementwise fusions, except for a step with small
  activations, and on AVX-512 for Adam(W) or a model with depthwise convs; none for a
  batch-1 training step on AVX-512), each first checked against the installed jaxlib:
  these are experimental XLA:CPU options, and one a jaxlib does not know is left out with
  a one-line notice (``accepted_cpu_options``), never an error;
- conv kernels stored ``HWIO`` in every layout (``default_kernel_storage``), which removes
  the kernel transpose XLA:CPU runs per conv per call in a channels-first model;
- channels-first models computing channels-last inside (``default_activation_storage``):
  XLA:CPU runs its convs physically channels-last, and the dot-based conv algorithms of a
  channels-first program would otherwise read channels-first, with copies between the two.

GPU runs get neither. The conv plan of the default ``"auto"`` convs comes from
``layoutlab.nn.conv_algos.default_plan``, keyed by ``table_cpu_kind()``. Everything here is read
when a run is configured, never while a step is traced.
"""

from __future__ import annotations

import functools
import sys

__all__ = [
    "BF16_FLAGS",
    "BF16_SUFFIX",
    "CPU_FAST_OPTIONS",
    "ELTWISE_MIN_ACTIVATION",
    "accepted_cpu_options",
    "cpu_fast_options",
    "cpu_has_bf16",
    "cpu_kind",
    "default_activation_storage",
    "default_backend",
    "default_kernel_storage",
    "default_skip_branch",
    "fast_compile_options",
    "resolve_activation_storage",
    "resolve_kernel_storage",
    "table_cpu_kind",
]

_YNN = "LIBRARY_FUSION_TYPE_"
_YNN_KEY = "xla_cpu_experimental_ynn_fusion_type"
# Both modes run convs on Eigen, whose backward is much faster than YNNPACK's, and dots on
# YNNPACK. A training step also hands reductions and elementwise fusions to YNNPACK:
# otherwise XLA splits every BatchNorm reduction into a slow reduce-window. Inference has no
# batch statistics, and there YNNPACK's elementwise fusions are slower than XLA's own loops
# (docs/performance/measurements.md#compile-options, as every choice below).
CPU_FAST_OPTIONS = {
    "train": {_YNN_KEY: f"{_YNN}INDIVIDUAL_DOT,{_YNN}REDUCE,{_YNN}ELTWISE"},
    "infer": {_YNN_KEY: f"{_YNN}INDIVIDUAL_DOT"},
}
# On AVX-512 an Adam or AdamW step leaves elementwise fusions to XLA's loops, which run its
# update over every parameter faster; SGD steps keep them unless their convs run oneDNN's
# kernels. Optimizer names: train's, and bench's "pytorch" (momentum SGD).
SGD_OPTIMIZERS = ("sgd", "momentum", "pytorch")
# Below this many elements in a step's largest conv output (batch included) an SGD step
# leaves elementwise fusions to XLA's loops: each YNNPACK fusion costs tens of microseconds
# a call, more than small tensors repay.
ELTWISE_MIN_ACTIVATION = 1 << 20


def cpu_fast_options(
    mode: str,
    optimizer: str | None = None,
    kind: str | None = None,
    batch: int | None = None,
    depthwise: bool = False,
    activation: int | None = None,
    onednn_convs: bool = False,
) -> dict:
    """The XLA:CPU compile options measured fastest for ``mode`` ("train" or "infer") with
    ``optimizer`` (a train or bench optimizer name; None: ``layoutlab train``'s AdamW) on a
    CPU of ``kind`` (``cpu_kind()``; None: this one) at ``batch`` (None: not known), for a
    model with ``depthwise`` convs or not (``models.has_depthwise_convs``) whose step's
    largest conv output holds ``activation`` elements (None: not known;
    ``models.largest_conv_output`` times the batch), and whose convs run oneDNN's kernels
    (``onednn_convs``) or not."""
    if mode not in CPU_FAST_OPTIONS:
        raise ValueError(f"mode must be one of {sorted(CPU_FAST_OPTIONS)}, got {mode!r}.")
    options = dict(CPU_FAST_OPTIONS[mode])
    kind = kind or cpu_kind()
    avx512 = kind == "avx512"
    if mode == "train" and batch == 1 and avx512:
        # A batch-1 training step runs fastest on XLA's own defaults (convs on YNNPACK too);
        # from batch 8 the options win.
        return {}
    # A depthwise model's SGD step too: MobileNetV2's ran slower with them, ResNets' not.
    small = activation is not None and activation < ELTWISE_MIN_ACTIVATION
    measured_small = small and kind in ("avx2", "avx512")
    # Around oneDNN's convs (custom calls) an AVX-512 SGD step ran faster without them too.
    if mode == "train" and (
        measured_small
        or (avx512 and (depthwise or onednn_convs or optimizer not in SGD_OPTIMIZERS))
    ):
        kinds = options[_YNN_KEY].split(",")
        options[_YNN_KEY] = ",".join(k for k in kinds if k != f"{_YNN}ELTWISE")
    return options


def default_backend() -> str:
    """JAX's default platform: ``"cpu"``, ``"gpu"`` or ``"tpu"`` (starts the backend)."""
    import jax

    return jax.default_backend()


@functools.cache
def _accepted(name: str, value) -> bool:
    """Whether this jaxlib's XLA:CPU compiles with option ``name=value`` (once per process)."""
    import jax
    import jax.numpy as jnp

    x = jax.device_put(jnp.zeros((2,), jnp.float32), jax.devices("cpu")[0])
    lowered = jax.jit(lambda a: a + 1).lower(x)
    try:
        lowered.compile(compiler_options={name: value})
    except Exception as err:  # jaxlib raises XlaRuntimeError/ValueError by version
        print(
            f"note: this jaxlib does not accept the XLA:CPU option {name}={value!r} "
            f"({' '.join(str(err).split())[:120]}); running without it.",
            file=sys.stderr,
        )
        return False
    return True


def accepted_cpu_options(options: dict) -> dict:
    """``options`` without the ones the installed jaxlib's XLA:CPU rejects (each rejected
    one is named once per process on stderr)."""
    return {k: v for k, v in options.items() if _accepted(k, v)}


def fast_compile_options(
    mode: str,
    backend: str | None = None,
    optimizer: str | None = None,
    batch: int | None = None,
    depthwise: bool = False,
    activation: int | None = None,
    onednn_convs: bool = False,
) -> dict:
    """The default compile options of a ``mode`` step with ``optimizer`` at ``batch`` on
    ``backend`` (default: JAX's), for a model with ``depthwise`` convs or not, a largest
    conv output of ``activation`` elements and convs on oneDNN (``onednn_convs``) or not:
    ``cpu_fast_options`` as far as this jaxlib accepts them on CPU, none elsewhere."""
    backend = backend or default_backend()
    if backend != "cpu":
        return {}
    options = cpu_fast_options(
        mode,
        optimizer,
        batch=batch,
        depthwise=depthwise,
        activation=activation,
        onednn_convs=onednn_convs,
    )
    return accepted_cpu_options(options)


def default_skip_branch(backend: str | None = None) -> str:
    """How a training step skips non-finite gradients (``train.skip``): ``"cond"`` on CPU,
    where the selects of ``"select"`` cost extra passes over every parameter
    (docs/performance/measurements.md#skipping-non-finite-steps), ``"select"`` elsewhere."""
    return "cond" if (backend or default_backend()) == "cpu" else "select"


def default_kernel_storage(backend: str | None = None) -> str:
    """``"channels_last"`` (HWIO kernels) on CPU, where XLA computes convs in that order;
    ``"layout"`` elsewhere (nothing measured says otherwise on GPU)."""
    return "channels_last" if (backend or default_backend()) == "cpu" else "layout"


def resolve_kernel_storage(storage: str, backend: str | None = None) -> str:
    """``storage``, with ``"auto"`` resolved for ``backend`` (``default_kernel_storage``)."""
    return default_kernel_storage(backend) if storage == "auto" else storage


def default_activation_storage(backend: str | None = None) -> str:
    """``"channels_last"`` on CPU: a channels-first model takes and returns its own layout
    but computes channels-last inside, like PyTorch's channels_last memory format
    (docs/performance/measurements.md#activation-storage); ``"layout"`` elsewhere, where XLA assigns
    physical layouts itself."""
    return "channels_last" if (backend or default_backend()) == "cpu" else "layout"


def resolve_activation_storage(storage: str, backend: str | None = None) -> str:
    """``storage``, with ``"auto"`` resolved for ``backend`` (``default_activation_storage``)."""
    return default_activation_storage(backend) if storage == "auto" else storage


@functools.cache
def _cpu_flags() -> list[str] | None:
    """The first ``flags`` line of ``/proc/cpuinfo`` (None where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(
                (line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []
            )
    except OSError:
        return None


def cpu_kind() -> str:
    """``"avx512"``, ``"avx2"`` or ``"other"``: the x86 vector extension the CPU has (from
    ``/proc/cpuinfo``). The conv defaults differ between the first two: YNNPACK's dots use
    AVX-512 where XLA:CPU's Eigen convs do not."""
    flags = _cpu_flags()
    if flags is None:
        return "other"
    if "avx512f" in flags:
        return "avx512"
    return "avx2" if "avx2" in flags else "other"


# Flags of bfloat16 multiply units: AVX-512's dot-product instructions (Cooper Lake, Zen 4
# and later) or AMX's tile multiplies (Sapphire Rapids and later).
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
BF16_SUFFIX = "_bf16"


def cpu_has_bf16() -> bool:
    """Whether the CPU multiplies bfloat16 in hardware (any of ``BF16_FLAGS``): where it
    does not, oneDNN widens bfloat16 convs to float32 as XLA does, and they gain nothing."""
    return any(flag in BF16_FLAGS for flag in _cpu_flags() or ())


def table_cpu_kind(platform: str) -> str | None:
    """The CPU kind that keys the shipped conv table on ``platform``: ``cpu_kind()``, with
    ``BF16_SUFFIX`` on an AVX-512 CPU with bfloat16 units (``cpu_has_bf16``), e.g.
    ``"avx512_bf16"``; None off CPU, where the table has no rules. The table keys its
    bfloat16 rules by the whole kind and every other dtype's by ``cpu_kind()``'s part
    (``default_plan.table_key``), so such a CPU runs the AVX-512 float32 rules."""
    if platform != "cpu":
        return None
    kind = cpu_kind()
    return kind + BF16_SUFFIX if kind == "avx512" and cpu_has_bf16() else kind
