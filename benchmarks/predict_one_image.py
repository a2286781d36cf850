"""``predict`` on one image beside the same model in PyTorch eager on that image.

    python benchmarks/predict_one_image.py [--model resnet18] [--stem cifar|none] [--layout NHWC]
        [--rounds 30] [--out benchmarks/results/predict_one_image_resnet18_cifar_cpu]

Trains a run for one step on synthetic 32x32x3 data (the weights do not change the
time), writes one PNG, then times in interleaved rounds, each starting one call later (A B
C, B C A, ...: each call follows every other equally often), each call once this process
is idle (``bench.timing.settle``: PyTorch's OpenMP threads spin for about 10 ms after it):

- ``layoutlab predict_files``: what `layoutlab predict` runs after loading the run: read
  and normalize the image, the run's forward (compiled once, with the run's inference XLA
  options), top-k;
- ``layoutlab forward``: that forward alone on the prepared image, ``jax.jit`` of
  ``make_forward`` (on the conv plan predict runs at batch 1) called with the run's state
  (its pytree flattened on every call);
- ``layoutlab Run.logits``: the same program as predict calls it, the state's leaves
  flattened once when the run was opened;
- ``layoutlab Run.logits, training plan``: the same call on the conv plan the run trained
  with (what predict ran before it planned each batch from the table's inference rules,
  ``infer.plan``; the two are one program when those plans agree);
- ``layoutlab forward, no XLA options``: the same forward compiled without the options
  (what predict ran before);
- ``torch eager <format>``: the PyTorch mirror of the model (``bench.torch_runner``) on
  the same image, read and normalized with PIL and NumPy, ``torch.inference_mode``, in
  ``contiguous`` and ``channels_last`` memory, and contiguous on one thread.

Each row: the median ms with its 95% interval, and the ratio to the faster PyTorch row as
the median of per-round ratios with its interval (``bench.stats.paired_ratio``). Also the
first predict_files call's time (trace + compile) and the second's (cached).
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from layoutlab.bench.cases import TorchCase, Workload
from layoutlab.bench.machine import finish_machine_info, machine_info
from layoutlab.bench.report import markdown_grid
from layoutlab.bench.stats import OtherLoad, dispersion, median_interval, paired_ratio
from layoutlab.bench.timing import interleaved_rounds, settle
from layoutlab.bench.torch_runner import build_torch_model
from layoutlab.infer.load import jitted_flat_forward, open_run
from layoutlab.infer.predict import load_images, predict_files
from layoutlab.layout import to_layout
from layoutlab.train.config import TrainConfig
from layoutlab.train.fast_config import compile_options
from layoutlab.train.loop import train_and_evaluate
from layoutlab.train.steps import make_forward


def _train(workdir: Path, args) -> None:
    config = TrainConfig(
        model=args.model,
        model_kwargs=_kwargs(args),
        data="synthetic:32x32x3:10:64",
        layout=args.layout,
        num_steps=1,
        batch_size=32,
        tensorboard=False,
    )
    train_and_evaluate(config, workdir, quiet=True)


def _kwargs(args) -> dict:
    return {} if args.stem == "none" else {"stem": args.stem}


def _torch_call(module, torch, memory_format, png: Path, mean, std):
    from PIL import Image

    def call():
        with Image.open(png) as image:
            pixels = np.asarray(image.convert("RGB"), np.float32)
        x = (pixels / 255.0 - mean) / std
        t = torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1)[None]))
        t = t.contiguous(memory_format=memory_format)
        with torch.inference_mode():
            return module(t).numpy()

    return call


def _plan_summary(run, image) -> str:
    """How many convs predict's forward runs each algorithm on ``image`` with."""
    from collections import Counter

    from flax import nnx

    from layoutlab.nn.conv_config import running_algorithms

    model = nnx.merge(run.inference_defs(image).eval, run.params, run.model_state)
    counts = Counter(running_algorithms(model, image).values())
    return ", ".join(f"{n} {name}" for name, n in sorted(counts.items()))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet18")
    p.add_argument("--stem", default="cifar", help="a ResNet's stem; none: a model without")
    p.add_argument("--layout", default="NHWC")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--note", default=None)
    p.add_argument("--out", required=True, help="path without suffix: writes .json and .md")
    args = p.parse_args(argv)
    import torch
    from PIL import Image

    machine = machine_info("cpu", note=args.note)
    workdir = Path(tempfile.mkdtemp()) / "run"
    _train(workdir, args)
    run = open_run(workdir)
    png = workdir.parent / "one.png"
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(png)

    t0 = time.perf_counter()
    predict_files(run, [png])
    first_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    predict_files(run, [png])
    second_s = time.perf_counter() - t0

    image = jax.device_put(to_layout(load_images([png], run.dataset), "NHWC", run.config.layout))
    state = run.state()
    options = compile_options(run.config, "infer") or None
    defs = run.inference_defs(image)  # the conv plan predict runs at batch 1
    fast = jax.jit(make_forward(defs), compiler_options=options)
    plain = jax.jit(make_forward(defs))
    leaves, treedef = jax.tree.flatten(state)
    trained = jitted_flat_forward(run.defs, treedef, tuple(sorted((options or {}).items())))
    calls = {
        "layoutlab predict_files": lambda: predict_files(run, [png]),
        "layoutlab forward": lambda: np.asarray(fast(state, image)),
        "layoutlab Run.logits": lambda: np.asarray(run.logits(image)),
        "layoutlab Run.logits, training plan": lambda: np.asarray(trained(leaves, image)),
        "layoutlab forward, no XLA options": lambda: np.asarray(plain(state, image)),
    }
    workload = Workload(args.model, tuple(_kwargs(args).items()), (32, 32), 3, 10, "infer", 1)
    module = build_torch_model(TorchCase(workload, "contiguous", "fp32")).eval()
    mean = np.asarray(run.dataset.mean, np.float32)
    std = np.asarray([s if s > 0 else 1.0 for s in run.dataset.std], np.float32)
    for name, fmt in (("contiguous", torch.contiguous_format), ("channels_last",
                                                                torch.channels_last)):  # fmt: skip
        mod = copy.deepcopy(module).to(memory_format=fmt)  # .to() converts in place
        calls[f"torch eager {name}"] = _torch_call(mod, torch, fmt, png, mean, std)
    # One thread: under contention PyTorch's two OpenMP threads wait for each other at every
    # op's barrier, which a single thread never does (what a loaded machine costs each).
    single = _torch_call(module, torch, torch.contiguous_format, png, mean, std)
    threads = torch.get_num_threads()

    def one_thread():
        torch.set_num_threads(1)
        try:
            return single()
        finally:
            torch.set_num_threads(threads)

    calls["torch eager contiguous, 1 thread"] = one_thread
    meter = OtherLoad()
    rounds = interleaved_rounds(calls, args.rounds, warmup=3, rotate=True, quiet=settle)
    others = meter.cores()
    torch_rows = [k for k in rounds if k.startswith("torch")]
    best = min(torch_rows, key=lambda k: np.median(rounds[k]))
    rows = []
    for name, ms in rounds.items():
        ci = median_interval(ms)
        ratio = paired_ratio(rounds[best], ms)
        rows.append({
            "name": name, "median_ms": float(np.median(ms)),
            "ci": None if ci is None else [ci.low, ci.high], "dispersion": dispersion(ms),
            "vs_torch_best": None if ratio is None else list(ratio), "rounds_ms": ms,
        })  # fmt: skip
    result = {
        "machine": finish_machine_info(machine),
        "torch_threads": torch.get_num_threads(),
        "other_cores": others,
        "first_predict_files_s": first_s,
        "second_predict_files_s": second_s,
        "torch_best": best,
        "rows": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    body = [
        (r["name"], f"{r['median_ms']:.2f} [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}]",
         f"{r['dispersion']:.1%}",
         "" if r["vs_torch_best"] is None else
         "{:.2f} [{:.2f}, {:.2f}]".format(*r["vs_torch_best"]))
        for r in rows
    ]  # fmt: skip
    lines = [
        f"# predict on one image: {args.model} {args.stem}, {args.layout}, fp32, batch 1",
        "",
        f"predict's conv plan: {_plan_summary(run, image)}",
        "",
        f"first predict_files call (trace + compile): {first_s:.2f} s; second: {second_s:.3f} s;"
        f" other processes used {others:.2f} cores while timing (2-core machine).",
        "",
        *markdown_grid(
            (
                "call",
                "ms median [95%]",
                "IQR/median",
                f"vs {best} (per-round ratio, >1 faster) [95%]",
            ),
            body,
        ),  # fmt: skip
        "",
        "```",
        json.dumps(result["machine"], indent=1),
        "```",
    ]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:12]))


if __name__ == "__main__":
    main()
