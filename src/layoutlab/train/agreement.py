"""Every process of a multi-process run trains the same run, or none of them trains.

JAX checks only that the processes join; a process started with another learning rate, data
set or conv algorithm trains silently wrong or dies in a collective with a C++ trace. So
before anything compiles each process resolves its run into a fingerprint
(``run_fingerprint``: the validated config, the data's shape, size and content digest, the
step schedule, the versions of Python, jax, jaxlib, flax, optax and layoutlab, the backend,
and the shapes and dtypes of the model's state) and publishes it in the key-value store of
the coordination service that ``jax.distributed.initialize`` started. Process 0 compares
every process's with its own and publishes the verdict: every process then stops with the
same one-line error naming the fields that differ and each process's value, or goes on.

Choices one process makes for all (the conv plan: a tuning measures, the shipped table
depends on the CPU) are made once, by process 0, and published (``decided_by_process_0``);
the others wait for them while process 0 keeps saying it is alive. A process that fails
records its error (``liveness.report_failure``), so the others stop with it instead of
waiting.
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
import threading
import time
import zlib
from collections.abc import Callable

import numpy as np

from layoutlab.train.liveness import FAILED, report_failure

__all__ = ["agree_on_run", "decided_by_process_0", "describe_differences", "run_fingerprint"]

_PREFIX = "layoutlab/"
# How often a waiting process looks for another process's failure, and how often process 0
# says it is still deciding; both far below any sensible join timeout.
_POLL_S = 0.5
_BEAT_S = 2.0
# Differing fields named in the error line; the rest are counted.
_SHOWN = 4
_VALUE_CHARS = 60
_PACKAGES = ("jax", "jaxlib", "flax", "optax")
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


def _versions() -> dict[str, str]:
    import layoutlab

    out = {"python": platform.python_version(), "layoutlab": layoutlab.__version__}
    for name in _PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "none"
    return out


def _data_digest(dataset) -> str:
    """The digest of the files the data was read from (or its spec), which loading it
    computed (``Dataset.fingerprint``, what a resume compares too), so the data is hashed
    once. A data set without one (built in Python): a CRC-32 of the images and labels
    themselves, at about five times blake2b's speed (CIFAR's 737 MB of float32 in about a
    second)."""
    known = dataset.fingerprint or {}
    if "sha256" in known or "spec" in known:
        return str(known.get("sha256") or known["spec"])
    crc = 0
    for array in (*dataset.split("train"), *dataset.split("test")):
        crc = zlib.crc32(str((array.shape, array.dtype.str)).encode(), crc)
        data = array if array.flags.c_contiguous else np.ascontiguousarray(array)
        crc = zlib.crc32(memoryview(data).cast("B"), crc)
    return f"{crc:08x}"


def _key_name(entry) -> str:
    for attribute in ("key", "idx", "name"):
        if hasattr(entry, attribute):
            return str(getattr(entry, attribute))
    return str(entry)


def _state_structure(model) -> dict[str, str]:
    """``{"features.0.kernel": "(3, 3, 1, 8) float32", ...}`` of an abstract model's state."""
    import jax
    from flax import nnx

    leaves, _ = jax.tree_util.tree_flatten_with_path(nnx.state(model))
    out = {}
    for path, leaf in leaves:
        names = [_key_name(k) for k in path]
        name = ".".join(names[:-1] if names and names[-1] == "value" else names)
        shape = getattr(leaf, "shape", ())
        out[name] = f"{tuple(shape)} {getattr(leaf, 'dtype', type(leaf).__name__)}"
    return out


def run_fingerprint(config, dataset, schedule, model) -> dict[str, str]:
    """What must be the same on every process, resolved (``learning_rate`` 0.1 and 1e-1 are
    one value; a data set is its contents, wherever its files lie): field -> value text.
    ``config`` is validated, ``model`` abstract (``nnx.eval_shape``)."""
    import dataclasses

    import jax

    from layoutlab.layout import parse_layout
    from layoutlab.train.run_precision import resolve_policy

    fields = {}
    for name, value in config.to_dict().items():
        if name == "data":  # the path may differ between hosts: the contents may not
            continue
        if name == "precision":
            value = str(resolve_policy(value))
        elif name == "layout":
            value = parse_layout(value).name
        fields[name] = json.dumps(value, sort_keys=True)
    summary = dataset.summary()
    for name in ("name", "train_size", "test_size", "image_shape", "num_classes", "class_names"):
        fields[f"data.{name}"] = json.dumps(summary[name])
    fields["data.contents"] = _data_digest(dataset)
    for name, value in dataclasses.asdict(schedule).items():
        fields[f"schedule.{name}"] = str(value)
    for name, value in _versions().items():
        fields[f"versions.{name}"] = value
    fields["backend"] = jax.default_backend()
    for name, value in _state_structure(model).items():
        fields[f"state.{name}"] = value
    return fields


def _short(value: str | None) -> str:
    if value is None:
        return "(none)"
    return value if len(value) <= _VALUE_CHARS else value[: _VALUE_CHARS - 3] + "..."


def describe_differences(prints: list[dict[str, str]]) -> str | None:
    """One line naming each field where a process differs from process 0, with the values
    (``prints[k]`` is process ``k``'s fingerprint); None when they all agree. The model
    state's leaves count as one field, shown by its first differing leaf."""
    reference, differing = prints[0], {}
    for k, other in enumerate(prints[1:], start=1):
        for name in [*reference, *(n for n in other if n not in reference)]:
            if reference.get(name) != other.get(name):
                differing.setdefault(name, []).append(k)
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
        values = [f"{_short(reference.get(name))} on process 0"]
        values += [f"{_short(prints[k].get(name))} on process {k}" for k in differing[name]]
        parts.append(f"{label}: {', '.join(values)}")
    more = len(names) - _SHOWN
    return "; ".join(parts) + (f"; and {more} more field(s)" if more > 0 else "")


def _next_round(name: str) -> str:
    _rounds[0] += 1
    return f"{_PREFIX}{name.replace(' ', '_')}/{_rounds[0]}"


def agree_on_run(fingerprint: Callable[[], dict[str, str]]) -> None:
    """Raises ``DistributedError`` (one line, the same on every process) unless every
    process's ``fingerprint()`` equals process 0's; nothing to do in a single process."""
    import jax

    from layoutlab.train.distributed import DistributedError

    if jax.process_count() == 1:
        return
    client, timeout = _client(), _timeout_s()
    me, count = jax.process_index(), jax.process_count()
    base = _next_round("run")
    try:
        mine = fingerprint()
        client.key_value_set(f"{base}/{me}", json.dumps(mine))
        if me == 0:
            prints = [
                json.loads(_wait(client, f"{base}/{k}", timeout, f"process {k}'s run settings"))
                for k in range(1, count)
            ]
            differences = describe_differences([mine, *prints])
            client.key_value_set(f"{base}/verdict", differences or "")
        else:
            differences = _wait(client, f"{base}/verdict", 2 * timeout, "process 0's check")
    except Exception as e:
        report_failure(str(e))
        raise
    if differences:
        raise DistributedError(
            f"the processes of this run differ: {differences}; start every process with "
            "the same settings, data and versions."
        )


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

    threading.Thread(target=beat, daemon=True, name=f"layoutlab-{name}-beat").start()
    try:
        text = json.dumps(decide())
        client.key_value_set(f"{base}/value", text)
    except Exception as e:
        report_failure(str(e))
        raise
    finally:
        done.set()
    return json.loads(text)  # what the others get, to the type (tuples come back as lists)
