"""Does timing layoutlab and PyTorch step by step in one process slow either of them?

    python benchmarks/archive/interleaving_bias.py --cases unet:infer:8,resnet18:infer:1 \
        --out benchmarks/results/interleaving_bias_avx512_cpu

``bench --torch`` runs one step of each configuration per round (A B A B ...), so both see
the same machine load. Each step then starts after the other framework's: its caches,
thread pool and allocator state are the other one's, and PyTorch's OpenMP threads spin for
about 10 ms after its step. This times, per case, four groups with the bench's own runners
and timer (``bench.sweep.run_group``, in blocks as ``bench`` runs them with ``--blocks``):
layoutlab alone (its defaults, NHWC fp32), PyTorch eager alone (channels_last fp32), the
two interleaved as ``bench`` does (each turn once the process is idle,
``bench.timing.settle``), and the two interleaved with no wait; twice, in that order and
again, so drift shows. Prints each median and the ratio PyTorch / layoutlab (above 1:
layoutlab faster) alone and interleaved, and writes ``results.json`` with every row and the
machine.
"""

from __future__ import annotations

import argparse

from interleaved_steps import bench_options, runner, save_results, workload

from layoutlab.bench.cases import TorchCase
from layoutlab.bench.machine import machine_info
from layoutlab.bench.sweep import run_group
from layoutlab.bench.timing import settle
from layoutlab.bench.torch_runner import TorchRunner

KEEP = ("framework", "step_ms_median", "step_ms_ci_low", "step_ms_ci_high", "dispersion",
        "other_cores", "status", "unstable_reason")  # fmt: skip


def _groups(model: str, mode: str, batch: int):
    w = workload(model, mode, batch)
    options = bench_options(w)

    def ours():
        return runner(w, "defaults", options)

    def theirs():
        return TorchRunner(TorchCase(w, "channels_last", "fp32"))

    return {"layoutlab alone": lambda: [ours()], "torch alone": lambda: [theirs()],
            "interleaved": lambda: [ours(), theirs()],
            "interleaved, no wait": lambda: [ours(), theirs()]}  # fmt: skip


def _median(rows: list[dict], framework: str) -> float | None:
    found = [r for r in rows if r["framework"] == framework and r["status"] == "ok"]
    return found[0]["step_ms_median"] if found else None


def run(cases: list[str], budget: float, blocks: bool) -> list[dict]:
    out = []
    for case in cases:
        model, mode, batch = case.rsplit(":", 2)
        groups = _groups(model, mode, int(batch))
        for repeat in (1, 2):
            for name, make in groups.items():
                quiet = (lambda: None) if name.endswith("no wait") else settle
                rows = run_group(make(), repeats="auto", warmup=3, budget_s=budget,
                                 blocks=blocks, quiet=quiet)  # fmt: skip
                for r in rows:
                    out.append({"case": case, "repeat": repeat, "group": name,
                                **{k: r.get(k) for k in KEEP}})  # fmt: skip
                got = {fw: _median(rows, fw) for fw in ("layoutlab", "torch")}
                print(case, repeat, name, {k: v for k, v in got.items() if v}, flush=True)
    return out


def markdown(rows: list[dict]) -> str:
    groups = ("interleaved", "interleaved, no wait")
    lines = ["| case | repeat | layoutlab alone ms | torch alone ms | torch / layoutlab alone "
             + "".join(f"| layoutlab {g} ms | torch {g} ms | torch / layoutlab {g} "
                       for g in groups) + "|",
             "|---" * 11 + "|"]  # fmt: skip
    for case in dict.fromkeys(r["case"] for r in rows):
        for repeat in (1, 2):

            def ms(group, fw, case=case, repeat=repeat):
                return _median([r for r in rows if (r["case"], r["repeat"], r["group"])
                                == (case, repeat, group)], fw)  # fmt: skip

            pairs = [(ms(g, "layoutlab"), ms(g, "torch")) for g in ("layoutlab alone",) + groups]
            pairs[0] = (pairs[0][0], ms("torch alone", "torch"))
            if None in sum(pairs, ()):
                continue
            cells = [f"{a:.2f} | {b:.2f} | {b / a:.2f}" for a, b in pairs]
            lines.append(f"| {case} | {repeat} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--cases",
        default="unet:infer:8,resnet18:infer:1",
        help="MODEL:MODE:BATCH,... (MODEL as interleaved_steps.workload takes it)",
    )
    p.add_argument("--time-budget", type=float, default=10.0, help="seconds per group")
    p.add_argument("--blocks", action="store_true", help="short steps in blocks, as bench")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    machine = machine_info("cpu", note="interleaving_bias")
    rows = run(args.cases.split(","), args.time_budget, args.blocks)
    save_results(args.out, machine, rows)
    print(markdown(rows))


if __name__ == "__main__":
    main()
