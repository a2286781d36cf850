"""kill -9 over training, saving and resuming, then ``--resume``: does every run end bit for
bit where the uninterrupted run ends?

    python benchmarks/kill_resume_attack.py --out benchmarks/results/kill_resume_attack_zen4_cpu.md

An attack through the command line alone. For each configuration (``keep_checkpoints`` 1
and 3; one process, and two processes joined through a coordinator on 127.0.0.1 with two CPU
devices each) it trains a tiny ``small_cnn`` on digits uninterrupted (checkpoints every 2
steps, evaluations every 4, a ``steps.jsonl`` line every step), then runs chains: a fresh
launch of the same run, killed; ``--resume``, killed; ...; a last ``--resume`` to the end.
Each kill is SIGKILL to the process group of one or both processes, at a moment drawn from
``--seed``:

- *save*: once the watched ``checkpoints/`` shows the save of step N starting, after a
  delay of up to one save's duration (as measured in the uninterrupted run);
- *train*: once the save before step N ended, after up to the time between two saves;
- *resume*: a ``--resume`` killed once process 0 used 0.5-0.95 times the CPU time a launch
  took to its first logged step.

Where it landed is read from the workdir: *during save* when the kill left the directory
mid-save (an orbax temporary folder, a step without its manifest, ``deleting/``); *during
resume* when a ``--resume`` had not trained a step yet; else *during training*. The chain's
last resume must exit 0 (else the run is *lost*), and its newest checkpoint (every array of
the train state), every ``metrics.jsonl`` row (timings aside) and every ``steps.jsonl`` row
must equal the uninterrupted run's bit for bit. After each kill the rows written so far must
be the uninterrupted run's too. Everything happens in a temporary directory; every launch
has a timeout. Exit code 0 when no run was lost and every run was equal, else 1.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import random
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from kill_resume_report import SETUP_NAMES, write_report
from kill_resume_runs import POLL_S, Launch, Watch, records, save_evidence, state_difference

__all__ = ["SETUPS", "main", "plan"]

# A chain's kills: beyond four, the resumes would start past the last step.
CHAIN = 4
AIMS, WEIGHTS = ("save", "train", "resume"), (0.4, 0.3, 0.3)
CHECKPOINT_EVERY, EVAL_EVERY = 2, 4
DISTRIBUTED_TIMEOUT_S = 10
# How long the survivor of a two-process run may take to notice its peer is gone.
SURVIVOR_GRACE_S = DISTRIBUTED_TIMEOUT_S + 30
SETUPS = {"1p-keep1": (1, 1), "1p-keep3": (1, 3), "2p-keep1": (2, 1), "2p-keep3": (2, 3)}
assert tuple(SETUPS) == SETUP_NAMES


@dataclass(frozen=True)
class Kill:
    aim: str  # save | train | resume
    step: int  # the step whose save or training triggers it (0 for resume)
    u: float  # in [0, 1): the delay's share of its window
    victims: tuple[int, ...]

    @property
    def aimed(self) -> str:
        return f"{self.aim} @ {self.step}" if self.step else self.aim


def plan(name: str, kills: int, steps: int, seed: int) -> list[list[Kill]]:
    """The setup's chains of kills, from ``seed`` and the setup's name alone."""
    rng = random.Random(f"{seed}/{name}")
    processes = SETUPS[name][0]
    chains = math.ceil(kills / CHAIN)
    sizes = [kills // chains + (i < kills % chains) for i in range(chains)]
    return [_chain(rng, size, steps, processes) for size in sizes if size]


def _chain(rng: random.Random, size: int, steps: int, processes: int) -> list[Kill]:
    aims = rng.choices(AIMS, WEIGHTS, k=size)
    if aims[0] == "resume":  # the first launch of a chain is fresh
        aims[0] = rng.choice(AIMS[:2])
    placed = sum(a != "resume" for a in aims)
    picks = iter(sorted(rng.sample(range(1, steps + 1), placed)))
    out, last = [], 0
    for aim in aims:
        step = 0
        if aim != "resume":
            step = max(next(picks), last + 1)
            if aim == "save":  # a step that saves
                step = -(-step // CHECKPOINT_EVERY) * CHECKPOINT_EVERY
            else:  # a step after a save, so that the trigger (the save ending) is seen
                step = max(step, CHECKPOINT_EVERY + 1)
                step += step % CHECKPOINT_EVERY == 0
            if step > steps:  # no such step left: a kill of the next resume
                aim, step = "resume", 0
            last = step or last
        victims = (0,) if processes == 1 else rng.choice(((0, 1), (0, 1), (0,), (1,)))
        out.append(Kill(aim, step, rng.random(), victims))
    return out


@dataclass
class Timing:
    """The kills' windows, from the uninterrupted run, then from each launch that trained:
    the CPU time process 0 takes to its first logged step (CPU time rather than wall time,
    which other jobs on the machine stretch), a save, and the training between two saves."""

    first_cpu: float
    save_span: float
    train_span: float

    @classmethod
    def of(cls, watch: Watch) -> Timing:
        return cls(watch.cpu_at_first_growth, _median(watch.save_spans), _median(watch.train_spans))


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2] if values else 0.05


@dataclass
class Result:
    setup: str
    chain: int
    index: int
    kill: Kill
    delay_s: float = 0.0
    at_s: float = 0.0  # since the launch
    cpu_s: float = 0.0  # process 0's CPU time then
    hit: tuple[int, ...] = ()
    landed: str = ""  # save | train | resume | missed | lost
    evidence: tuple[str, ...] = ()
    survivor: str = ""
    survivor_s: float | None = None
    survivor_lines: int = 0
    resumed_from: str = ""
    problems: list[str] = field(default_factory=list)


class Attack:
    def __init__(self, args, root: Path):
        self.args, self.root = args, root
        self.env = {
            **os.environ,
            "JAX_PLATFORMS": "cpu",
            "JAX_COMPILATION_CACHE_DIR": str(root / "jax_cache"),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "LAYOUTLAB_AUTOTUNE_CACHE": str(root / "autotune.json"),
            "MPLBACKEND": "Agg",
            "XLA_FLAGS": "--xla_force_host_platform_device_count=1",
        }
        self.train = ["--tiny", "--steps", str(args.steps), "--batch-size", "16", "--seed", "7",
                      "--set", f"eval_every={EVAL_EVERY}",
                      "--set", f"checkpoint_every={CHECKPOINT_EVERY}",
                      "--set", "tensorboard=false", "--log-every", "1",
                      "--conv-tune", "never",
                      "--xla-option", "xla_backend_optimization_level=0"]  # fmt: skip
        self.notes: dict[str, int] = {}
        self.findings: list[str] = []

    def launch(self, name: str, workdir: Path, resume: bool, tag: str) -> Launch:
        processes, keep = SETUPS[name]
        argv = ["--resume"] if resume else [*self.train, "--set", f"keep_checkpoints={keep}"]
        logs = self.root / "logs"
        logs.mkdir(exist_ok=True)
        return Launch(
            argv, workdir, processes, self.env, logs / f"{name}-{tag}", DISTRIBUTED_TIMEOUT_S
        )

    def reference(self, name: str) -> tuple[Path, Timing]:
        workdir = self.root / name / "reference" / "run"
        workdir.parent.mkdir(parents=True)
        launch = self.launch(name, workdir, False, "reference")
        watch = Watch(workdir, launch)
        finished = launch.wait(self.args.timeout, watch)
        if not finished or any(launch.codes()):
            sys.exit(f"error: the uninterrupted {name} run failed: {launch.stderr(0)[-2000:]}")
        return workdir, Timing.of(watch)

    def chain(self, name, c, kills, ref: Path, timing: Timing) -> tuple[list[Result], str]:
        """Runs one chain; returns its kills and its outcome: equal, not equal, lost."""
        workdir = self.root / name / f"chain{c}" / "run"
        workdir.parent.mkdir(parents=True)
        want = {f: records(ref / f) for f in ("metrics.jsonl", "steps.jsonl")}
        results, finished = [], False
        for j, kill in enumerate(kills):
            result = Result(name, c, j + 1, kill)
            results.append(result)
            launch = self.launch(name, workdir, j > 0, f"chain{c}-{j + 1}")
            self._attack(launch, Watch(workdir, launch), kill, timing, result, resume=j > 0)
            self._resumed(launch, results[-2] if j else None)
            print(
                f"  {name} run {c} kill {j + 1}: aimed {kill.aimed} -> {result.landed}", flush=True
            )
            for f, rows in want.items():
                got = records(workdir / f)
                if got != rows[: len(got)]:
                    result.problems.append(
                        f"{f} rows differ from the uninterrupted run's after the kill"
                    )
            if result.landed == "lost":
                return results, "lost"
            if result.landed == "missed":
                finished = True
                break
        if not finished:
            launch = self.launch(name, workdir, True, f"chain{c}-final")
            ok = launch.wait(self.args.timeout)
            self._resumed(launch, results[-1])
            if not ok or any(launch.codes()):
                results[-1].problems.append(
                    f"the last --resume exited {launch.codes()}: {launch.stderr(0)[-1500:]}"
                )
                return results, "lost"
        try:
            diff = state_difference(ref, workdir)
        except Exception as e:  # no certified checkpoint to read: the run is not the same
            diff = f"reading the newest checkpoint failed: {e}"
        for f, rows in want.items():
            if records(workdir / f) != rows:
                diff = diff or f"{f} rows differ"
        if diff:
            results[-1].problems.append(diff)
        return results, "not equal" if diff or any(r.problems for r in results) else "equal"

    def _attack(self, launch: Launch, watch: Watch, kill: Kill, timing: Timing, result, resume):
        cpu = timing.first_cpu * (0.5 + 0.45 * kill.u)
        while len(launch.alive()) == len(launch.processes):
            watch.poll()
            if self._fired(kill, watch, launch, cpu):
                break
            if watch.since_start() > self.args.timeout:
                launch.kill(range(len(launch.processes)))
                result.landed, result.problems = "lost", ["the launch hung"]
                return
            time.sleep(POLL_S)
        else:
            return self._ended_by_itself(launch, result)
        window = {"save": timing.save_span, "train": timing.train_span, "resume": 0.0}[kill.aim]
        result.delay_s = kill.u * window
        time.sleep(result.delay_s)
        result.at_s, result.cpu_s = watch.since_start(), launch.cpu_seconds(0)
        result.hit = tuple(launch.kill(kill.victims))
        if not result.hit:
            return self._ended_by_itself(launch, result)
        watch.poll()
        if survivors := launch.alive():  # the other process of two: it must stop by itself
            self._survivor(launch, survivors[0], result)
        result.evidence = tuple(sorted(save_evidence(watch.ckpt_dir) - watch.evidence_before))
        if resume and not watch.trained():
            result.landed = "resume"
        else:
            result.landed = "save" if result.evidence else "train"
        if watch.trained():
            timing.first_cpu = watch.cpu_at_first_growth

    def _survivor(self, launch: Launch, i: int, result: Result) -> None:
        """Waits for process ``i``, whose peer was killed, to stop by itself; notes how long
        it took and how many lines it printed meanwhile (gloo's connection lines aside)."""
        t, said = time.monotonic(), len(launch.stderr(i))
        if launch.wait(SURVIVOR_GRACE_S):
            after = launch.stderr(i)[said:].splitlines()
            lines = sum(not x.startswith("[Gloo]") for x in after)
            result.survivor_s, result.survivor_lines = time.monotonic() - t, lines
            result.survivor = (
                f"process {i} ended by itself in {result.survivor_s:.0f} s, "
                f"exit {launch.codes()[i]}, {lines} stderr lines"
            )
        else:
            result.survivor = f"process {i} still running after {SURVIVOR_GRACE_S} s: killed"
            self.findings.append(
                f"{result.setup} run {result.chain} kill {result.index}: {result.survivor}"
            )

    @staticmethod
    def _fired(kill: Kill, watch: Watch, launch: Launch, cpu: float) -> bool:
        """Whether the launch reached the kill's trigger: for a resume, ``cpu`` seconds of
        CPU time of process 0; for a save, the save's first entry in ``checkpoints/``; for
        training, the end of the save before the step."""
        if kill.aim == "resume":
            return launch.cpu_seconds(0) >= cpu
        # Passed it unseen (a resume from the step before it, say). The loop logs the steps
        # since the last save just before the next save starts.
        passed = watch.trained() and watch.last_step is not None and watch.last_step > kill.step
        if kill.aim == "train":
            return passed or (str(kill.step - 1) in watch.appeared and not watch.saving)
        return passed or any(
            n == str(kill.step) or n.startswith(f"{kill.step}.") for n in watch.appeared
        )

    def _ended_by_itself(self, launch: Launch, result: Result) -> None:
        """A launch that ended before its kill: finished (a missed kill) or failed (lost)."""
        launch.wait(self.args.timeout)
        if all(code == 0 for code in launch.codes()):
            result.landed = "missed"
        else:
            result.landed = "lost"
            result.problems.append(
                f"exited {launch.codes()} before the kill: {launch.stderr(0)[-1500:]}"
            )

    def _resumed(self, launch: Launch, previous: Result | None) -> None:
        """Counts the lines of layoutlab's own that a launch printed, by kind, and notes
        the step the resume after ``previous`` started from."""
        text = "\n".join(launch.stderr(i) for i in range(len(launch.processes)))
        for line in text.splitlines():
            if line.startswith(("note:", "Resuming from", "error:")):
                kind = re.sub(r"\d+", "N", line.replace(str(self.root), "<tmp>"))
                self.notes[kind] = self.notes.get(kind, 0) + 1
        if previous is not None:
            if m := re.search(r"Resuming from .*\(step (\d+)\)", text):
                previous.resumed_from = m.group(1)
            elif "starting from step 0" in text:
                previous.resumed_from = "0 (fresh start)"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=32, help="kills over all configurations (32)")
    p.add_argument("--quick", action="store_true",
                   help="one-process configurations only, 8 steps instead of 12")  # fmt: skip
    p.add_argument("--configs", default=None, help=f"comma-separated subset of {','.join(SETUPS)}")
    p.add_argument("--seed", type=int, default=0, help="seed of the kill schedule (0)")
    p.add_argument("--timeout", type=float, default=300, help="seconds per launch (300)")
    p.add_argument("--out", type=Path, help="write the results as markdown here")
    p.add_argument("--keep-tmp", action="store_true", help="keep the temporary directory")
    argv = sys.argv[1:] if argv is None else argv
    args = p.parse_args(argv)
    names = args.configs.split(",") if args.configs else [
        n for n in SETUPS if not (args.quick and SETUPS[n][0] > 1)
    ]  # fmt: skip
    if unknown := [n for n in names if n not in SETUPS]:
        p.error(f"unknown configuration {unknown[0]}; choose from {', '.join(SETUPS)}")
    if args.kills < len(names):
        p.error(f"--kills must be at least the number of configurations ({len(names)})")
    if args.out and not args.out.parent.is_dir():
        p.error(f"--out: no directory {args.out.parent}")
    args.steps = 8 if args.quick else 12
    started, t0 = datetime.datetime.now(datetime.UTC), time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="kill-resume-attack-"))
    attack, rows, details = Attack(args, root), [], []
    try:
        for i, name in enumerate(names):
            kills = args.kills // len(names) + (i < args.kills % len(names))
            chains = plan(name, kills, args.steps, args.seed)
            print(f"{name}: the uninterrupted run, then {kills} kills in {len(chains)} chains",
                  flush=True)  # fmt: skip
            ref, timing = attack.reference(name)
            outcomes = []
            for c, chain in enumerate(chains, 1):
                results, outcome = attack.chain(name, c, chain, ref, timing)
                details += results
                outcomes.append(outcome)
                if outcome != "equal":
                    attack.findings.append(f"{name} chain {c}: {outcome} (seed {args.seed})")
            rows.append(_totals(name, [r for r in details if r.setup == name], outcomes))
    finally:
        if args.keep_tmp:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    elapsed = time.monotonic() - t0
    report = write_report(
        args, argv, rows, details, attack.notes, attack.findings, started, elapsed
    )
    print(report.split("\n## Every kill")[0])
    print(f"elapsed: {elapsed:.0f} s")
    if args.out:
        args.out.write_text(report)
    lost_or_unequal = sum(r["lost"] + r["not equal"] for r in rows)
    return 1 if lost_or_unequal or attack.findings else 0


def _totals(name: str, results: list[Result], outcomes: list[str]) -> dict:
    landed = [r.landed for r in results]
    return {
        "configuration": name,
        "attempted": len(results),
        "kills": sum(x in ("save", "train", "resume") for x in landed),
        "save": landed.count("save"),
        "train": landed.count("train"),
        "resume": landed.count("resume"),
        "missed": landed.count("missed"),
        "chains": len(outcomes),
        "lost": outcomes.count("lost"),
        "not equal": outcomes.count("not equal"),
    }


if __name__ == "__main__":
    sys.exit(main())
