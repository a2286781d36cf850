"""The markdown page of ``kill_resume_attack.py``: the command, the machine, the totals per
configuration, every kill, and what the resumes said."""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
from pathlib import Path

import layoutlab
from layoutlab.bench.machine import cpu_id, cpu_model, library_versions

__all__ = ["SETUP_NAMES", "write_report"]

SETUP_NAMES = ("1p-keep1", "1p-keep3", "2p-keep1", "2p-keep3")
COLUMNS = (
    ("configuration", "configuration"),
    ("attempted", "kills attempted"),
    ("kills", "kills landed"),
    ("save", "during save"),
    ("train", "during training"),
    ("resume", "during resume"),
    ("missed", "missed (run ended first)"),
    ("chains", "runs"),
    ("lost", "runs lost"),
    ("not equal", "runs not bitwise equal"),
)


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, cwd=Path(__file__).parent, timeout=10)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() or "unknown"


def _table(head: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(str(x) for x in row) + " |" for row in rows]


def write_report(args, argv, rows, details, notes, findings, started, elapsed) -> str:
    """The whole page, as text."""
    versions = library_versions()
    versions["orbax-checkpoint"] = _version("orbax-checkpoint")
    versions["layoutlab"] = layoutlab.__version__
    total = {k: sum(r[k] for r in rows) for k, _ in COLUMNS[1:]}
    command = shlex.join(["python", "benchmarks/kill_resume_attack.py", *(argv or [])])
    load = os.getloadavg()
    lines = [
        "# kill -9 over training, saving and resuming, then `--resume`: bitwise or not",
        "",
        "```bash",
        command,
        "```",
        "",
        f"{total['kills']} kills landed in {total['chains']} runs ({total['save']} during a "
        f"save, {total['train']} during training, {total['resume']} during a resume): "
        f"{total['lost']} runs lost, {total['not equal']} not bitwise equal to the "
        "uninterrupted run.",
        "",
        f"- Machine: {cpu_model()} ({cpu_id()}), {os.cpu_count()} cores, "
        f"{platform.platform()}; Python {platform.python_version()}, "
        + ", ".join(f"{k} {v}" for k, v in versions.items() if v)
        + f". Code: `{_commit()}`.",
        f"- {started:%Y-%m-%d %H:%M} UTC, {elapsed:.0f} s; load average at the end "
        f"{load[0]:.1f} (other jobs shared the cores, so the moments the kills hit vary "
        "from run to run; the schedule does not).",
        f"- Each run: `layoutlab train --tiny` (small_cnn on digits), {args.steps} steps of "
        "batch 16, checkpoints every 2 steps, evaluations every 4, a `steps.jsonl` line "
        "every step, seed 7; two processes: `--distributed` with a coordinator on "
        "127.0.0.1, two CPU devices each, `--distributed-timeout 10`. Kill schedule: "
        f"`--seed {args.seed}`.",
        "",
        *_table(
            [h for _, h in COLUMNS],
            [[r[k] for k, _ in COLUMNS] for r in rows]
            + [["all", *(total[k] for k, _ in COLUMNS[1:])]],
        ),  # fmt: skip
        "",
        "*During save*: the kill left `checkpoints/` mid-save (an orbax temporary folder, a "
        "step without `layoutlab_manifest.json`, `deleting/`); a kill in the parts of a save "
        "that leave no trace (copying the state to the host, between the manifest and a "
        "deletion) counts as *during training*. *During resume*: a `--resume` killed before "
        "it trained a step (start-up, restore, compile). A run is *lost* when a launch that "
        "was not killed failed, the last `--resume` included; *not bitwise equal* when its "
        "newest checkpoint (every array of the train state), a `metrics.jsonl` row (timings "
        "aside) or a `steps.jsonl` row differs from the uninterrupted run's, at the end or "
        "after any kill. Two processes: one killed, the other must stop by itself.",
        "",
        *_survivors(details),
    ]
    if findings:
        lines += ["## Findings", "", *(f"- {f}" for f in findings), ""]
    lines += ["## What the launches printed", "", *_table(["times", "line (numbers as N)"], [
        [n, f"`{_cell(line)[:160]}`"] for line, n in sorted(notes.items(), key=lambda x: -x[1])
    ]), ""]  # fmt: skip
    lines += ["## Every kill", "", *_table(
        ["configuration", "run", "kill", "aimed at", "processes killed", "delay ms", "at s (CPU s)",
         "landed", "left in checkpoints/", "next resume from step", "other process", "problems"],
        [[r.setup, r.chain, r.index, r.kill.aimed,
          ",".join(map(str, r.hit)) or "-", f"{r.delay_s * 1e3:.0f}",
          f"{r.at_s:.1f} ({r.cpu_s:.1f})", r.landed,
          ", ".join(r.evidence) or "-", r.resumed_from or "-", r.survivor or "-",
          "; ".join(_cell(p) for p in r.problems) or "-"]
         for r in details],
    ), ""]  # fmt: skip
    return "\n".join(lines)


def _survivors(details) -> list[str]:
    ended = [r for r in details if r.survivor_s is not None]
    if not ended:
        return []
    return [
        f"Two processes, one killed: the other stopped by itself {len(ended)} times, in "
        f"{min(r.survivor_s for r in ended):.0f}-{max(r.survivor_s for r in ended):.0f} s, "
        f"printing {min(r.survivor_lines for r in ended)}-"
        f"{max(r.survivor_lines for r in ended)} lines on stderr (gloo's own aside).",
        "",
    ]


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")[:300]


def _version(name: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None
