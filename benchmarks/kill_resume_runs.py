"""The launches of ``kill_resume_attack.py``: ``layoutlab train`` as one process or two (a
coordinator on 127.0.0.1), watched from outside through the files a run writes, killed with
SIGKILL, and read back for a bitwise comparison.

What the watch sees, and so how a kill is classified, comes from the workdir alone:
``steps.jsonl`` (one line per optimizer step with ``--log-every 1``) says how far a launch
trained, and ``checkpoints/`` says whether a save is under way (a folder orbax has not
renamed into place yet, a step without its ``layoutlab_manifest.json``, steps being deleted).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from layoutlab.train.checkpoint import MANIFEST, read_checkpoint

__all__ = [
    "Launch",
    "Watch",
    "records",
    "save_evidence",
    "state_difference",
]

# Per-row timings, the only fields of metrics.jsonl that differ between two equal runs.
TIMING_FIELDS = ("images_per_sec", "elapsed")
POLL_S = 0.002
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def save_evidence(ckpt_dir: Path) -> frozenset[str]:
    """What in ``ckpt_dir`` shows a save under way: anything but a step folder, a lock file
    and ``corrupt/`` (orbax's temporary folder, ``deleting/``), and a newest step folder
    without its manifest."""
    try:
        names = os.listdir(ckpt_dir)
    except FileNotFoundError:
        return frozenset()
    out = {n for n in names if not n.isdigit() and not n.endswith(".lock") and n != "corrupt"}
    steps = sorted(int(n) for n in names if n.isdigit())
    if steps and not (ckpt_dir / str(steps[-1]) / MANIFEST).exists():
        out.add(f"{steps[-1]} without {MANIFEST}")
    return frozenset(out)


def records(path: Path) -> list[dict]:
    """The rows of a JSON-lines file without their timings; a last line cut short by a kill
    is left out (it is the killed process's, and a resume drops it)."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for i, line in enumerate(lines):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise
        out.append({k: v for k, v in row.items() if k not in TIMING_FIELDS})
    return out


def _last_step(path: Path) -> int | None:
    rows = records(path)
    return rows[-1].get("step") if rows else None


@dataclass
class Watch:
    """Polls one workdir while a launch runs: when the launch first trained (a line appended
    to ``steps.jsonl``, not one rewritten by a resume; the loop writes them before each save
    and evaluation), the last step it logged, the CPU time process 0 had used by then, which
    checkpoint entries appeared, and when save evidence came and went."""

    workdir: Path
    launch: Launch
    t0: float = field(default_factory=time.monotonic)
    first_growth: float | None = None
    cpu_at_first_growth: float | None = None
    last_step: int | None = None
    appeared: set[str] = field(default_factory=set)
    saving: bool = False
    save_spans: list[float] = field(default_factory=list)
    train_spans: list[float] = field(default_factory=list)

    def __post_init__(self):
        self.steps_file = self.workdir / "steps.jsonl"
        self.ckpt_dir = self.workdir / "checkpoints"
        self.file = self._file_state()
        self.evidence_before = save_evidence(self.ckpt_dir)
        self.listing = self._listing()
        self._since: float | None = None  # the last change of ``saving``

    def _file_state(self):
        try:
            st = os.stat(self.steps_file)
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_size

    def _listing(self) -> set[str]:
        try:
            return set(os.listdir(self.ckpt_dir))
        except FileNotFoundError:
            return set()

    def poll(self) -> None:
        now = time.monotonic()
        state = self._file_state()
        if state != self.file:
            old, self.file = self.file, state
            grew = state is not None and (
                (old is None and state[1] > 0)
                or (old is not None and old[0] == state[0] and state[1] > old[1])
            )
            if grew and self.first_growth is None:
                self.first_growth = now
                self.cpu_at_first_growth = self.launch.cpu_seconds(0)
            if self.first_growth is not None:
                self.last_step = _last_step(self.steps_file)
        listing = self._listing()
        self.appeared |= listing - self.listing
        self.listing = listing
        saving = bool(save_evidence(self.ckpt_dir) - self.evidence_before)
        if saving != self.saving:
            if self._since is not None:  # a whole span: the save, or the steps between two
                (self.train_spans if saving else self.save_spans).append(now - self._since)
            self.saving, self._since = saving, now

    def trained(self) -> bool:
        return self.first_growth is not None

    def since_start(self) -> float:
        return time.monotonic() - self.t0


def _cpu_seconds(pid: int) -> float:
    """User and system CPU time of ``pid`` and its live descendants (0 once it is gone)."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
            for task in os.listdir(f"/proc/{p}/task"):
                todo += map(int, Path(f"/proc/{p}/task/{task}/children").read_text().split())
        except (OSError, IndexError, ValueError):  # it ended meanwhile
            pass
    return total


class Launch:
    """One ``layoutlab train`` launch of a run: one process, or two joined through a
    coordinator on 127.0.0.1 (two CPU devices each, as docs/guides/multihost.md starts
    them). Each process leads its own process group, so a kill takes its supervisor and
    trainer child together, as a power cut or the OOM killer would."""

    def __init__(self, argv, workdir, processes, env, log_prefix: Path, distributed_timeout):
        self.processes: list[subprocess.Popen] = []
        self.logs: list[tuple[Path, Path]] = []
        base = [sys.executable, "-m", "layoutlab.cli", "train", "--workdir", str(workdir), *argv]
        port = _free_port() if processes > 1 else None
        env = dict(env)
        if processes > 1:
            env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
        for i in range(processes):
            command = base
            if port is not None:
                command = [*base, "--distributed", "--coordinator", f"127.0.0.1:{port}",
                           "--num-processes", str(processes), "--process-id", str(i),
                           "--distributed-timeout", str(distributed_timeout)]  # fmt: skip
            out, err = Path(f"{log_prefix}-p{i}.out"), Path(f"{log_prefix}-p{i}.err")
            self.logs.append((out, err))
            with open(out, "w") as o, open(err, "w") as e:
                self.processes.append(
                    subprocess.Popen(
                        command,
                        env=env,
                        cwd=workdir.parent,
                        stdin=subprocess.DEVNULL,
                        stdout=o,
                        stderr=e,
                        start_new_session=True,
                    )  # fmt: skip
                )

    def cpu_seconds(self, i: int) -> float:
        """CPU time process ``i`` (its supervisor and trainer child) has used so far."""
        return _cpu_seconds(self.processes[i].pid)

    def alive(self) -> list[int]:
        return [i for i, p in enumerate(self.processes) if p.poll() is None]

    def kill(self, which) -> list[int]:
        """SIGKILLs the process groups of ``which`` still running; returns those it hit."""
        hit = []
        for i in which:
            p = self.processes[i]
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                    hit.append(i)
                except ProcessLookupError:
                    pass
        for i in hit:
            self.processes[i].wait()
        return hit

    def wait(self, timeout_s: float, watch: Watch | None = None) -> bool:
        """Waits for every process to end (polling ``watch`` meanwhile); False on timeout,
        after killing what was left."""
        deadline = time.monotonic() + timeout_s
        while self.alive():
            if time.monotonic() > deadline:
                self.kill(range(len(self.processes)))
                return False
            if watch is not None:
                watch.poll()
            time.sleep(POLL_S if watch is not None else 0.05)
        return True

    def codes(self) -> list[int | None]:
        return [p.returncode for p in self.processes]

    def stderr(self, i: int) -> str:
        return self.logs[i][1].read_text(errors="replace")


def state_difference(want_dir: Path, got_dir: Path) -> str | None:
    """None when the newest certified checkpoints of two runs hold the same step and every
    array of the train state (parameters, batch statistics, optimizer moments, RNG, step)
    bit for bit; else the first difference."""
    notes: list[str] = []
    want, want_meta = read_checkpoint(want_dir / "checkpoints", log=notes.append)
    got, got_meta = read_checkpoint(got_dir / "checkpoints", log=notes.append)
    if want_meta["step"] != got_meta["step"]:
        return f"newest step {got_meta['step']}, uninterrupted {want_meta['step']}"
    if want.keys() != got.keys():
        return f"arrays {sorted(set(want) ^ set(got))} in one run only"
    for path, w in want.items():
        g = got[path]
        if w.dtype != g.dtype or w.shape != g.shape or w.tobytes() != g.tobytes():
            return f"{path} differs"
    return None
