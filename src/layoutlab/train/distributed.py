"""Joining a multi-process run: ``jax.distributed.initialize`` with errors a user can act on.

``initialize_distributed()`` must run before anything starts JAX's backend. With no
arguments JAX detects the cluster (SLURM, Open MPI, GKE, Cloud TPU); explicit
``coordinator``/``num_processes``/``process_id`` (or JAX's environment variables) serve a
plain launch. JAX's coordination client aborts the process when it times out, with a C++
stack trace, so a watchdog thread turns "nobody answered within ``timeout_s``" into one
``error:`` line and exit code 2 first. After joining, every process checks that it joined
the run it asked for (a ``--num-processes`` that differs between processes is not an error
to JAX: the coordinator's count wins) and that every process has as many devices as it
has.

Once joined, ``train.liveness``'s watchdog turns a lost process into one line on every
process before JAX's heartbeat timeout (set past it) ends them with a C++ stack trace. A
second ``--process-id 0`` on the coordinator's host finds its port taken and stops before
joining.
"""

from __future__ import annotations

import errno
import os
import socket
import sys
import threading
import time

__all__ = [
    "DistributedError",
    "agree_on",
    "barrier",
    "initialize_distributed",
    "join_timeout",
    "main_process",
    "wall_clock",
]

# JAX's own timeout is set past the watchdog's, so the one-line error comes first.
_JAX_TIMEOUT_MARGIN_S = 30
_MAX_TIMEOUT_S = 2**31 - 1 - _JAX_TIMEOUT_MARGIN_S
# The join timeout of this process's run: how long the checks across processes wait.
_join_timeout_s = [120.0]


class DistributedError(ValueError):
    """The run could not be joined (no cluster, unreachable coordinator, mismatched counts)."""


def _parse_address(address: str) -> str:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise DistributedError(
            f"--coordinator {address!r} is not HOST:PORT (e.g. 10.0.0.1:1234 or "
            "127.0.0.1:1234 for processes on one machine)."
        )
    return address


_ENV = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")


def _from_environment() -> tuple[str | None, int | None, int | None]:
    """``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID`` when all
    three are set (JAX itself reads only the first); otherwise cluster detection."""
    values = [os.environ.get(name) for name in _ENV]
    if not all(values):
        return None, None, None
    try:
        return values[0], int(values[1]), int(values[2])
    except ValueError:
        raise DistributedError(
            f"{_ENV[1]}={values[1]!r} and {_ENV[2]}={values[2]!r} must be integers."
        ) from None


def _watchdog(timeout_s: float, what: str) -> threading.Event:
    done = threading.Event()

    def watch():
        if not done.wait(timeout_s):
            print(f"error: {what}", file=sys.stderr, flush=True)
            os._exit(2)

    threading.Thread(target=watch, daemon=True, name="distributed-watchdog").start()
    return done


def join_timeout() -> float:
    """Seconds the processes wait for each other (``initialize_distributed``'s timeout)."""
    return _join_timeout_s[0]


def _check_port_free(coordinator: str) -> None:
    """Process 0 serves the coordinator on its port (on every interface, as JAX binds it);
    gRPC shares a port with another gRPC server, so a second process 0 would join the wrong
    service instead of failing. A plain bind finds the port taken first."""
    port = int(coordinator.rpartition(":")[2])
    for family, host in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind((host, port))
            return
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise DistributedError(
                    f"port {port} of --coordinator {coordinator} is taken on this host, but "
                    "process 0 serves the coordinator there: another process was started "
                    "with --process-id 0 (give each process its own id, 0..N-1), or another "
                    "program holds the port (choose a free one)."
                ) from None
            # no IPv6 here: try IPv4


def initialize_distributed(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    timeout_s: float = 120.0,
) -> tuple[int, int]:
    """Joins the run and returns ``(process_index, process_count)``.

    On CPU the cross-process collectives go through gloo (XLA:CPU has no other). Raises
    ``DistributedError`` for arguments that cannot work; a coordinator that does not answer
    within ``timeout_s`` ends the process with a one-line ``error:`` and exit code 2.
    """
    import jax

    if coordinator is None and num_processes is None and process_id is None:
        coordinator, num_processes, process_id = _from_environment()
    given = [x is not None for x in (coordinator, num_processes, process_id)]
    if any(given) and not all(given):
        raise DistributedError(
            "--coordinator, --num-processes and --process-id go together (or none of them, "
            "to let JAX detect the cluster: SLURM, Open MPI, GKE, Cloud TPU)."
        )
    if coordinator is not None:
        _parse_address(coordinator)
        if num_processes < 1 or not 0 <= process_id < num_processes:
            raise DistributedError(
                f"--process-id must lie in [0, {num_processes}) for --num-processes "
                f"{num_processes}, got {process_id}."
            )
    # NaN fails every comparison, so only a test that lets good values through catches it;
    # JAX takes the timeouts as whole seconds in an int32.
    if not 0 < timeout_s <= _MAX_TIMEOUT_S:
        raise DistributedError(
            f"--distributed-timeout must be a number of seconds > 0 and <= {_MAX_TIMEOUT_S}, "
            f"got {timeout_s}; e.g. --distributed-timeout 120."
        )
    if coordinator is not None and process_id == 0:
        _check_port_free(coordinator)
    _join_timeout_s[0] = float(timeout_s)
    # XLA:CPU's cross-process collectives (GPUs use NCCL whatever this says).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    where = coordinator or "the detected coordinator"
    done = _watchdog(
        timeout_s,
        f"could not join the distributed run within {timeout_s:g} s: {where} did not "
        f"answer, or not all {num_processes or 'expected'} processes joined; start every "
        "process with the same --coordinator and --num-processes and its own --process-id "
        "(process 0 runs the coordinator) and check that the address is reachable.",
    )
    try:
        jax.distributed.initialize(
            coordinator_address=coordinator,
            num_processes=num_processes,
            process_id=process_id,
            initialization_timeout=int(timeout_s) + _JAX_TIMEOUT_MARGIN_S,
            heartbeat_timeout_seconds=int(timeout_s) + _JAX_TIMEOUT_MARGIN_S,
        )
    except ValueError as e:  # JAX found no cluster to detect
        done.set()
        raise DistributedError(
            f"--distributed found no cluster to join ({' '.join(str(e).split())}); pass "
            "--coordinator HOST:PORT --num-processes N --process-id I, or run under SLURM, "
            "Open MPI, GKE or Cloud TPU."
        ) from None
    except RuntimeError as e:
        done.set()
        raise DistributedError(f"jax.distributed.initialize failed: {e}") from None
    done.set()
    from layoutlab.train.liveness import start_watchdog

    start_watchdog(timeout_s)
    index, count = jax.process_index(), jax.process_count()
    _check_joined(num_processes, index, count)
    return index, count


def _check_joined(requested: int | None, me: int, count: int) -> None:
    """Every process learns every process's ``--num-processes`` and device count, through the
    coordination service's key-value store: a collective needs the same device count on every
    process (with another it crashed in a reshape, with a 40-line traceback)."""
    import json

    import jax
    from jax._src import distributed

    client = distributed.global_state.client
    mine = {"num_processes": requested, "devices": jax.local_device_count()}
    try:
        client.key_value_set(f"layoutlab/join/{me}", json.dumps(mine))
        timeout_ms = int(join_timeout() * 1000)
        joined = [
            json.loads(client.blocking_key_value_get(f"layoutlab/join/{k}", timeout_ms))
            for k in range(count)
        ]
    except Exception as e:  # a process gone after joining: the watchdog names it too
        raise DistributedError(
            f"the processes did not all report their device counts within {join_timeout():g} "
            f"s ({' '.join(str(e).split())[:200]}); check that every process runs."
        ) from None
    asked = sorted({j["num_processes"] for j in joined if j["num_processes"] is not None})
    if any(a != count for a in asked):
        raise DistributedError(
            f"the run has {count} processes but the processes were started with "
            f"--num-processes {asked}; start every process with --num-processes {count}."
        )
    devices = [j["devices"] for j in joined]
    if len(set(devices)) > 1:
        each = ", ".join(f"{d} on process {k}" for k, d in enumerate(devices))
        raise DistributedError(
            f"the processes have different numbers of devices ({each}), but every process "
            "holds the same share of each batch; give every process the same devices (e.g. "
            "the same CUDA_VISIBLE_DEVICES count, or XLA_FLAGS="
            "--xla_force_host_platform_device_count=N on CPU)."
        )


def main_process() -> bool:
    import jax

    return jax.process_index() == 0


def agree_on(value: int) -> int:
    """Process 0's ``value`` on every process (e.g. the clock that names a workdir)."""
    import jax

    if jax.process_count() == 1:
        return value
    import numpy as np
    from jax.experimental import multihost_utils

    return int(multihost_utils.broadcast_one_to_all(np.int32(value)))


def barrier(name: str) -> None:
    """Waits until every process got here (nothing to wait for in a single process)."""
    import jax

    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def wall_clock() -> int:
    return int(time.time())
