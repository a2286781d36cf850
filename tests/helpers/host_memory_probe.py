"""A fresh process that counts the page faults of XLA:CPU's per-call temp buffer.

Used by ``test_host_memory.py`` and ``benchmarks/archive/host_memory_top_pad.py``.

A jitted product through a 3072 x 3072 float32 intermediate (36 MB): the matmul does not fuse
with its producer, so XLA:CPU allocates a temp buffer of that size on every call, above
glibc's largest mmap threshold (32 MiB), and by default each call maps it fresh. A matmul, not
a sort of as many floats: the same buffer in 25 ms a call instead of 1.3 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

_PROBE = """
import json, resource, sys
from layoutlab.host import keep_host_memory, host_memory_state, release_host_memory

def apply(modes):
    for mode in modes.split("+"):
        release_host_memory() if mode == "released" else keep_host_memory(mode)

if sys.argv[1] != "default":
    apply(sys.argv[1])
import jax, jax.numpy as jnp
f = jax.jit(lambda x: (jnp.outer(x, x) + 1.0) @ x)
x = jnp.arange(3072, dtype=jnp.float32)
temp = f.lower(x).compile().memory_analysis().temp_size_in_bytes
faults = []
for call in range(48):
    if call == 4 and sys.argv[2]:
        apply(sys.argv[2])
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    f(x).block_until_ready()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"temp": temp, "faults": faults, "state": list(host_memory_state())}))
"""


def probe(mode: str = "default", tunables: str | None = None, then: str = "") -> dict:
    """``{"temp": bytes, "faults": [minor faults of each of 48 calls], "state": [kept, how]}``
    of a fresh process that calls ``keep_host_memory(mode)`` first (``"default"``: not at
    all), with ``GLIBC_TUNABLES`` set to ``tunables`` (None: unset). ``mode`` and ``then``
    may chain settings with ``+``, ``"released"`` for ``release_host_memory()``: ``then``
    is applied after the 4th call, with JAX running."""
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    if tunables:
        env["GLIBC_TUNABLES"] = tunables
    out = subprocess.run([sys.executable, "-c", _PROBE, mode, then], capture_output=True, text=True,
                         env=env, timeout=600, check=True).stdout  # fmt: skip
    return json.loads(out.strip().splitlines()[-1])
