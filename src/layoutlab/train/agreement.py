"""Every process of a multi-process run trains the same run, or none of them trains.

JAX checks only that the processes join; a process started with another learning rate, data
set or conv algorithm trains silently wrong or dies in a collective with a C++ trace. So
before anything compiles each process resolves its run into a fingerprint
(``run_fingerprint``: the validated config, the data's shape, size and content digest, the
step schedule, the versions of Python, jax, jaxlib, flax, optax and layoutlab and a digest of
layoutlab's own source files (a patched copy keeps its version string), the backend, the
number and kind of each process's devices, the JAX settings that change numerics
(``jax_enable_x64``, ``jax_default_matmul_precision``), and the shapes and dtypes of the
model's state) and publishes it in the key-value store of the coordination service that
``jax.distributed.initialize`` started. Process 0 compares every process's with its own and
publishes the verdict: every process then stops with the same one-line error naming the
fields that differ and each process's value, or goes on.

The workdir must be one directory that every process sees: each process writes its part of
every checkpoint there, and orbax waits (600 s) for parts that went to another disk. So the
run's agreement also compares the workdir's resolved path, and probes it: process 0 writes
a file with a fresh nonce into it and publishes the nonce; every other process reads that
file in its own workdir and reports what it found.

Choices one process makes for all (the conv plan: a tuning measures, the shipped table
depends on the CPU) are made once, by process 0, and published (``decided_by_process_0``);
the others wait for them while process 0 keeps saying it is alive. A process that fails
records its error (``liveness.report_failure``), so the others stop with it instead of
waiting.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path

from layoutlab.train.fingerprint import run_fingerprint, source_digest
from layoutlab.train.liveness import FAILED, report_failure

__all__ = [
    "agree_on_run",
    "decided_by_process_0",
    "describe_differences",
    "read_probe",
    "run_fingerprint",
    "source_digest",
    "verdict",
    "write_probe",
]

_PREFIX = "layoutlab/"
# How often a waiting process looks for another process's failure, and how often process 0
# says it is still deciding; both far below any sensible join timeout.
_POLL_S = 0.5
_BEAT_S = 2.0
# How long process 0 waits for its beat thread's store call to return after deciding.
_JOIN_S = 10.0
# Differing fields named in the error line; the rest are counted.
_SHOWN = 4
_VALUE_CHARS = 60
# The fingerprint fields of the workdir's check (``agree_on_run``'s ``workdir``).
WORKDIR, PROBE = "workdir", "workdir.probe"
_PROBE_FILE = ".layoutlab-probe-"
_NO_PROBE = "(no probe file)"
# Agreements made so far by this process: every process makes them in the same order, so
# the n-th one of each uses the same keys.
_rounds = [0]


def _one_line(error: BaseException | str) -> str:
    return " ".join(str(error).split())


def _client():
    from jax._src import distributed

    from layoutlab.train.distributed import DistributedError

    client = distributed.global_state.client
    if client is None:
        raise DistributedError(
            "this multi-process run was not joined through jax.distributed.initialize(), "
            "whose coordination service the processes check each other through; join with "
            "--distributed (or call jax.distributed.initialize() first)."
        )
    return client


def _timeout_s() -> float:
    from layoutlab.train.distributed import join_timeout

    return join_timeout()


def _missing(error: Exception) -> bool:
    """A key not (yet) set: what the store answers while the other process is still on its
    way, as opposed to a coordination service that failed."""
    text = str(error)
    return "DEADLINE_EXCEEDED" in text or "NOT_FOUND" in text


def _failure(client) -> str | None:
    try:
        return str(client.key_value_try_get(FAILED))
    except Exception:
        return None


def _wait(client, key: str, timeout_s: float, what: str, beat: str | None = None) -> str:
    """The value of ``key`` once a process sets it. Fails when another process reported a
    failure, when the store fails, or after ``timeout_s`` without the value (and without a
    new ``beat``: process 0 saying that it is still working on it)."""
    from layoutlab.train.distributed import DistributedError

    deadline, last_beat = time.monotonic() + timeout_s, None
    while True:
        try:
            return str(client.blocking_key_value_get(key, int(_POLL_S * 1000)))
        except Exception as e:
            if not _missing(e):
                raise DistributedError(
                    f"the coordination service failed while waiting for {what}: {_one_line(e)}"
                ) from None
        if (failed := _failure(client)) is not None:
            raise DistributedError(failed)
        if beat is not None:
            try:
                now_beat = str(client.key_value_try_get(beat))
            except Exception:
                now_beat = None
            if now_beat != last_beat:
                deadline, last_beat = time.monotonic() + timeout_s, now_beat
        if time.monotonic() > deadline:
            raise DistributedError(
                f"{what} did not come within {timeout_s:g} s; check that every process runs "
                "(its own error names the problem) or raise --distributed-timeout."
            )


def _short(value: str | None, chars: int | None = _VALUE_CHARS) -> str:
    if value is None:
        return "(none)"
    return value if chars is None or len(value) <= chars else value[: chars - 3] + "..."


def _differing(prints: list[dict[str, str]]) -> dict[str, list[int]]:
    """Field -> the processes whose value differs from process 0's."""
    reference, differing = prints[0], {}
    for k, other in enumerate(prints[1:], start=1):
        for name in [*reference, *(n for n in other if n not in reference)]:
            if reference.get(name) != other.get(name):
                differing.setdefault(name, []).append(k)
    return differing


def describe_differences(
    prints: list[dict[str, str]], chars: int | None = _VALUE_CHARS
) -> str | None:
    """One line naming each field where a process differs from process 0, with the values
    (``prints[k]`` is process ``k``'s fingerprint), each cut at ``chars`` (None: whole);
    None when they all agree. The model state's leaves count as one field, shown by its
    first differing leaf."""
    reference, differing = prints[0], _differing(prints)
    if not differing:
        return None
    names = [n for n in differing if not n.startswith("state.")]
    leaves = [n for n in differing if n.startswith("state.")]
    if leaves:
        names.append(leaves[0])
    parts = []
    for name in names[:_SHOWN]:
        label = name
        if name.startswith("state."):
            first = name.removeprefix("state.")
            label = f"model state ({len(leaves)} entries differ; first {first})"
        values = [f"{_short(reference.get(name), chars)} on process 0"]
        values += [f"{_short(prints[k].get(name), chars)} on process {k}" for k in differing[name]]
        parts.append(f"{label}: {', '.join(values)}")
    more = len(names) - _SHOWN
    return "; ".join(parts) + (f"; and {more} more field(s)" if more > 0 else "")


def _next_round(name: str) -> str:
    _rounds[0] += 1
    return f"{_PREFIX}{name.replace(' ', '_')}/{_rounds[0]}"


def verdict(prints: list[dict[str, str]]) -> str:
    """The error line of ``prints`` (process ``k``'s fingerprint at ``k``), the problem and
    its fix, or "" when they agree. A workdir that differs is the problem named first: a
    process writing elsewhere breaks every save, whatever else differs."""
    line = describe_differences(prints)
    if line is None:
        return ""
    differing = _differing(prints)
    if WORKDIR in differing or PROBE in differing:
        shared = [{n: p[n] for n in (WORKDIR, PROBE) if n in p} for p in prints]
        return (
            "the processes of this run do not share one workdir: "
            f"{describe_differences(shared, None)} (a {PROBE} other than process 0's: that "
            "process does not see the file process 0 wrote into its workdir); every process "
            "writes its part of each checkpoint there, so give every process the same "
            "--workdir on a filesystem they all share (NFS, a cluster filesystem)."
        )
    return (
        f"the processes of this run differ: {line}; start every process with the same "
        "settings, data, devices, environment and code (the same layoutlab source)."
    )


def write_probe(workdir: Path) -> tuple[str, Path]:
    nonce = secrets.token_hex(8)
    path = workdir / f"{_PROBE_FILE}{nonce}"
    path.write_text(nonce)
    return nonce, path


def read_probe(workdir: Path, nonce: str | None) -> str:
    """What this process finds of process 0's probe file in its own ``workdir``."""
    if not nonce:
        return _NO_PROBE
    try:
        return (workdir / f"{_PROBE_FILE}{nonce}").read_text()[:64] or "(an empty probe file)"
    except OSError:
        return _NO_PROBE


def agree_on_run(
    fingerprint: Callable[[], dict[str, str]], workdir: str | Path | None = None
) -> None:
    """Raises ``DistributedError`` (one line, the same on every process) unless every
    process's ``fingerprint()`` equals process 0's; nothing to do in a single process.
    ``workdir`` (created on every process): checked to be one directory that all of them
    see, by its resolved path and a probe file (see the module doc)."""
    import jax

    from layoutlab.train.distributed import DistributedError

    if jax.process_count() == 1:
        return
    client, timeout = _client(), _timeout_s()
    me, count = jax.process_index(), jax.process_count()
    base = _next_round("run")
    probe = None
    try:
        mine = fingerprint()
        if workdir is not None:
            workdir = Path(workdir)
            mine[WORKDIR] = str(workdir.resolve())
            if me == 0:
                mine[PROBE], probe = write_probe(workdir)
            else:  # process 0 publishes its fingerprint only once the probe file is written
                first = json.loads(_wait(client, f"{base}/0", timeout, "process 0's settings"))
                mine[PROBE] = read_probe(workdir, first.get(PROBE))
        client.key_value_set(f"{base}/{me}", json.dumps(mine))
        if me == 0:
            prints = [
                json.loads(_wait(client, f"{base}/{k}", timeout, f"process {k}'s run settings"))
                for k in range(1, count)
            ]
            line = verdict([mine, *prints])
            client.key_value_set(f"{base}/verdict", line)
        else:
            line = _wait(client, f"{base}/verdict", 2 * timeout, "process 0's check")
    except Exception as e:
        report_failure(str(e))
        raise
    finally:
        if probe is not None:
            probe.unlink(missing_ok=True)
    if line:
        raise DistributedError(line)


def decided_by_process_0(name: str, decide: Callable[[], object]):
    """``decide()``'s JSON value, computed on process 0 only and handed to every process
    (a single process just calls it). The others wait as long as process 0 keeps deciding,
    and stop with a one-line error if it fails or goes silent for the join timeout."""
    import jax

    if jax.process_count() == 1:
        return decide()
    client, timeout = _client(), _timeout_s()
    base = _next_round(name)
    if jax.process_index() != 0:
        return json.loads(
            _wait(client, f"{base}/value", timeout, f"process 0's {name}", beat=f"{base}/beat")
        )
    done = threading.Event()

    def beat():
        count = 0
        while not done.wait(min(_BEAT_S, timeout / 4)):
            count += 1
            try:
                client.key_value_set(f"{base}/beat", str(count), allow_overwrite=True)
            except Exception:  # the store is gone: the waiting processes learn it themselves
                return

    beater = threading.Thread(target=beat, daemon=True, name=f"layoutlab-{name}-beat")
    beater.start()
    try:
        text = json.dumps(decide())
        client.key_value_set(f"{base}/value", text)
    except Exception as e:
        report_failure(str(e))
        raise
    finally:
        # Out of its store call before this returns: a daemon thread still in one when the
        # interpreter finalizes aborts the process (liveness._done).
        done.set()
        beater.join(timeout=min(timeout, _JOIN_S))
    return json.loads(text)  # what the others get, to the type (tuples come back as lists)
