"""Mixed-precision policies: which dtype params are stored in, computed in and returned in.

A ``Policy`` is one frozen value. ``get_policy`` builds it from a policy name: a preset or a
jmp-style string such as ``"params=float32,compute=bfloat16,output=float32"`` (short forms
``"p=f32,c=bf16,o=f32"``). Layers in ``layoutlab.nn`` read the policy; the ops listed in
``FP32_OPS`` keep float32 whatever the compute dtype, the way ``torch.autocast`` keeps its
fp32 op list.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Policy", "get_policy", "PRESETS", "FP32_OPS", "parse_dtype"]

_DTYPE_NAMES = {
    "float32": jnp.float32,
    "f32": jnp.float32,
    "fp32": jnp.float32,
    "float": jnp.float32,
    "bfloat16": jnp.bfloat16,
    "bf16": jnp.bfloat16,
    "float16": jnp.float16,
    "f16": jnp.float16,
    "fp16": jnp.float16,
    "half": jnp.float16,
    "float64": jnp.float64,
    "f64": jnp.float64,
}

_KEYS = {
    "params": "param_dtype",
    "param": "param_dtype",
    "p": "param_dtype",
    "compute": "compute_dtype",
    "c": "compute_dtype",
    "output": "output_dtype",
    "o": "output_dtype",
}


def parse_dtype(name: str | np.dtype | type) -> np.dtype:
    """``"bf16"`` -> ``dtype('bfloat16')``; unknown names raise a ``ValueError``."""
    if isinstance(name, str):
        key = name.strip().lower()
        if key not in _DTYPE_NAMES:
            raise ValueError(
                f"Unknown dtype {name!r}; valid names are: {', '.join(sorted(_DTYPE_NAMES))}."
            )
        dtype = np.dtype(_DTYPE_NAMES[key])
    else:
        try:
            dtype = np.dtype(name)
        except TypeError as err:
            raise ValueError(f"{name!r} is not a dtype; use e.g. 'float32' or 'bf16'.") from err
        if not jnp.issubdtype(dtype, jnp.floating):
            raise ValueError(f"Policy dtypes must be floating point, got {dtype}.")
    if dtype == np.float64 and not jax.config.jax_enable_x64:
        # Without x64 JAX would silently compute in float32.
        raise ValueError(
            "float64 needs 64-bit mode: set jax.config.update('jax_enable_x64', True) first."
        )
    return dtype


def _cast_floating(tree, dtype):
    def cast(x):
        if isinstance(x, (jax.Array, np.ndarray, np.generic)) and jnp.issubdtype(
            x.dtype, jnp.floating
        ):
            return x.astype(dtype)
        return x

    return jax.tree.map(cast, tree)


@dataclasses.dataclass(frozen=True)
class Policy:
    """Param, compute and output dtypes, plus whether the ``FP32_OPS`` stay in float32.

    ``fp32_ops=False`` is apex's O3: everything, normalization included, runs in the
    compute dtype.
    """

    param_dtype: np.dtype = np.dtype(np.float32)
    compute_dtype: np.dtype = np.dtype(np.float32)
    output_dtype: np.dtype = np.dtype(np.float32)
    fp32_ops: bool = True

    def __post_init__(self):
        for field in ("param_dtype", "compute_dtype", "output_dtype"):
            object.__setattr__(self, field, parse_dtype(getattr(self, field)))

    def cast_to_param(self, tree):
        return _cast_floating(tree, self.param_dtype)

    def cast_to_compute(self, tree):
        return _cast_floating(tree, self.compute_dtype)

    def cast_to_output(self, tree):
        return _cast_floating(tree, self.output_dtype)

    @property
    def norm_dtype(self) -> np.dtype:
        """Dtype for normalization statistics and the other ``FP32_OPS``."""
        return np.dtype(np.float32) if self.fp32_ops else self.compute_dtype

    @property
    def is_half(self) -> bool:
        return self.compute_dtype.itemsize == 2

    @property
    def needs_loss_scaling(self) -> bool:
        """float16 gradients underflow without a loss scale; bfloat16 ones do not."""
        return self.compute_dtype == np.dtype(np.float16)

    def with_(self, **changes) -> Policy:
        return dataclasses.replace(self, **changes)

    def __str__(self) -> str:
        return (
            f"params={self.param_dtype.name},compute={self.compute_dtype.name},"
            f"output={self.output_dtype.name}" + ("" if self.fp32_ops else ",fp32_ops=false")
        )


_F32, _BF16, _F16 = np.dtype(np.float32), np.dtype(jnp.bfloat16), np.dtype(np.float16)

PRESETS: dict[str, Policy] = {
    "fp32": Policy(_F32, _F32, _F32),
    "bf16": Policy(_BF16, _BF16, _BF16),
    "fp16": Policy(_F16, _F16, _F16),
    "mixed_bf16": Policy(_F32, _BF16, _F32),
    "mixed_fp16": Policy(_F32, _F16, _F32),
    # apex opt levels, in layoutlab terms:
    # O0: pure fp32.
    "O0": Policy(_F32, _F32, _F32),
    # O1: fp32 params, fp16 compute with the FP32_OPS exceptions, fp32 output.
    "O1": Policy(_F32, _F16, _F32),
    # O2: fp32 master params cast to fp16 for the whole model, BatchNorm in fp32, fp16 output.
    "O2": Policy(_F32, _F16, _F16),
    # O3: pure fp16, normalization included.
    "O3": Policy(_F16, _F16, _F16, fp32_ops=False),
}

# The ops that stay in float32 under any policy with fp32_ops=True, and why.
# tests/core/test_precision_rules.py checks this table against what the layers actually compute.
FP32_OPS: dict[str, str] = {
    "BatchNorm": "mean/variance over the batch lose digits in half precision",
    "GroupNorm": "mean/variance over groups lose digits in half precision",
    "GlobalAvgPool": "a long sum over spatial positions",
    "AvgPool": "window sums are accumulated in float32",
    "softmax_cross_entropy": "log-softmax and the loss overflow or lose digits in half",
}


def get_policy(policy: Policy | str | None, /) -> Policy:
    """The ``Policy`` of a policy name: a preset (see ``PRESETS``) or
    ``"params=...,compute=...,output=..."``; a ``Policy`` as it is, None as ``fp32``.

    The keys are jmp's (``p``/``params``, ``c``/``compute``, ``o``/``output``), but the
    grammar differs from jmp's ``get_policy`` where a dtype is left out: here it is
    float32, in jmp the compute dtype follows the params and the output follows the compute.
    So ``"c=bf16"`` means params float32, compute bfloat16, output **float32** here (the
    usual mixed policy, ``mixed_bf16``) and output bfloat16 in jmp; ``"p=bf16"`` computes
    in float32 here, in bfloat16 in jmp. ``half`` is always float16 (jmp: bfloat16 on TPU),
    and a bare dtype (``"f32"``) is not a policy (jmp: all three dtypes); the presets
    ``fp32``, ``bf16`` and ``fp16`` are. Spell all three dtypes out to mean the same in both.
    """
    if policy is None:
        return PRESETS["fp32"]
    if isinstance(policy, Policy):
        return policy
    if not isinstance(policy, str):
        raise TypeError(
            f"A policy must be a Policy or a policy name (str), got {type(policy).__name__}."
        )
    text = policy.strip()
    for name, preset in PRESETS.items():
        if text.lower() == name.lower():
            return preset
    if "=" not in text:
        raise ValueError(
            f"Unknown precision policy {policy!r}; use a preset ({', '.join(PRESETS)}) or "
            "'params=float32,compute=bfloat16,output=float32' (short: 'p=f32,c=bf16,o=f32')."
        )
    fields: dict[str, object] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep:
            raise ValueError(f"Policy part {part!r} in {policy!r} is not of the form key=value.")
        if key == "fp32_ops":
            if "fp32_ops" in fields:
                raise ValueError(f"Policy key 'fp32_ops' is given twice in {policy!r}.")
            if value.strip().lower() not in ("true", "false"):
                raise ValueError(f"fp32_ops must be true or false, got {value!r}.")
            fields["fp32_ops"] = value.strip().lower() == "true"
            continue
        if key not in _KEYS:
            raise ValueError(
                f"Unknown policy key {key!r} in {policy!r}; valid keys are: "
                f"{', '.join(sorted(_KEYS))}, fp32_ops."
            )
        if _KEYS[key] in fields:
            raise ValueError(f"Policy key {key!r} is given twice in {policy!r}.")
        fields[_KEYS[key]] = parse_dtype(value)
    missing = {"param_dtype", "compute_dtype", "output_dtype"} - set(fields)
    if missing:
        # Unlike jmp (whose compute dtype follows params and output follows compute), a
        # dtype left out is float32: "c=bf16" is then the usual mixed policy, not pure bf16.
        for name in missing:
            fields[name] = _F32
    return Policy(**fields)
