"""One malloc arena (``keep_host_memory``) at a small batch, with PyTorch in the process.

    python benchmarks/archive/host_memory_small_batch.py --mode train --batch 8 --keep
    python benchmarks/archive/host_memory_small_batch.py --mode train --batch 8 --keep per_thread
    python benchmarks/archive/host_memory_small_batch.py --mode train --batch 8

Sets the malloc settings or not (``--keep``: one arena; ``--keep per_thread``: per-thread
arenas; or run any of them under ``GLIBC_TUNABLES``), then
builds MobileNetV2 CIFAR's default layoutlab step (NHWC, fp32, SGD with momentum) and the
PyTorch mirror's (channels_last). It times, in three passes: layoutlab's step alone, the two
alternating (each timed), and PyTorch's alone. Processes differ in machine state, so run the
variants alternately and compare them across several runs.
"""

from __future__ import annotations

import argparse
import statistics


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="mobilenet_v2")
    p.add_argument("--mode", default="train", choices=("train", "infer"))
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument(
        "--keep", nargs="?", const="one", choices=("one", "per_thread"),
        help="call keep_host_memory(arenas) first (no value: one arena)",
    )  # fmt: skip
    args = p.parse_args(argv)
    if args.keep:
        from layoutlab.host import keep_host_memory

        keep_host_memory(args.keep)  # before JAX starts
    from interleaved_steps import bench_options, runner, workload

    from layoutlab.bench.cases import TorchCase
    from layoutlab.bench.timing import timed
    from layoutlab.bench.torch_runner import TorchRunner

    w = workload(args.model, args.mode, args.batch)
    jax_step = runner(w, "defaults", bench_options(w))
    jax_step.setup()
    torch_step = TorchRunner(TorchCase(w, "channels_last", "fp32"))
    torch_step.setup()

    def ms(times):
        return f"{1e3 * statistics.median(times):.1f}"

    for _ in range(3):
        jax_step.step()
        torch_step.step()
    alone = [timed(jax_step.step) for _ in range(args.steps)]
    mixed = [(timed(torch_step.step), timed(jax_step.step)) for _ in range(args.steps)]
    torch_alone = [timed(torch_step.step) for _ in range(args.steps)]
    print(f"{args.model} {args.mode} b{args.batch} keep={args.keep}: layoutlab alone "
          f"{ms(alone)} ms, alternating {ms([j for _, j in mixed])} ms; PyTorch alternating "
          f"{ms([t for t, _ in mixed])} ms, alone {ms(torch_alone)} ms")  # fmt: skip


if __name__ == "__main__":
    main()
