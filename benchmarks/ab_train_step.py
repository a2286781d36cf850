"""Same-run A/B of one training step between two checkouts of layoutlab (e.g. before/after a
refactor), interleaved round by round on one machine.

Each side runs in its own long-lived worker process (``PYTHONPATH=<checkout>/src``) that
builds the model through the public API, compiles the step once, reports a hash of the
optimized HLO, and then times ``--steps`` calls whenever the driver asks. The driver
alternates the order of the sides every round, so drift on a shared machine falls on both.
Identical HLO hashes mean XLA compiled the same program on both sides; the timings then
only show the machine's noise.

    python benchmarks/ab_train_step.py --a /tmp/old --b . --out benchmarks/results/ab_x
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from layoutlab.bench.machine import cpu_model

# The worker uses only entry points that both sides of a refactor keep: models.create,
# nn.configure (conv_config.set_conv_algorithm before it), train.state/steps/skip and
# xla.cpu_fast_options.
WORKER = r"""
import hashlib, json, re, sys, time
import jax, jax.numpy as jnp, numpy as np, optax
from flax import nnx
from layoutlab import models
from layoutlab.train.skip import skip_nonfinite
from layoutlab.train.state import create_train_state
from layoutlab.train.steps import make_train_step
from layoutlab.xla import cpu_fast_options
from layoutlab.loss_scale import get_loss_scale

cfg = json.loads(sys.argv[1])
model = models.create(cfg["model"], num_classes=10, layout=cfg["layout"], rngs=nnx.Rngs(0),
                      **cfg["model_kwargs"])
if cfg["algorithm"] != "xla":
    from layoutlab import nn
    if hasattr(nn, "configure"):
        model = nn.configure(model, nn.ConvSettings.named(cfg["algorithm"]))
    else:  # a tree from before nn.configure
        from layoutlab.nn.conv_config import set_conv_algorithm
        set_conv_algorithm(model, cfg["algorithm"])
tx = skip_nonfinite(optax.sgd(0.01, momentum=0.9))
defs, state = create_train_state(model, tx, get_loss_scale(None))
h, w, c = cfg["image_shape"]
shape = (cfg["batch"], h, w, c) if cfg["layout"] == "NHWC" else (cfg["batch"], c, h, w)
rng = np.random.default_rng(0)
images = jnp.asarray(rng.standard_normal(shape, dtype=np.float32))
labels = jnp.asarray(rng.integers(0, 10, cfg["batch"]).astype(np.int32))
options = cpu_fast_options("train") if cfg["cpu_fast"] else None
step = jax.jit(make_train_step(defs, tx), donate_argnums=(0,), compiler_options=options)
t0 = time.perf_counter()
compiled = step.lower(state, images, labels).compile()
compile_s = time.perf_counter() - t0
# A structural fingerprint of the optimized program: the debug tables (source files, stack
# frames), op metadata and every instruction/parameter name differ between checkouts (file
# paths, a renamed state field) without changing what runs, so they are left out.
lines = [l for l in compiled.as_text().splitlines()
         if not re.match(r"^(\d+ |FileNames|FunctionNames|FileLocations|StackFrames)", l)]
text = re.sub(r",? metadata=\{[^}]*\}", "", "\n".join(lines))
text = re.sub(r"\b[A-Za-z_][\w\-]*(\.\d+)+\b", "N", text)
text = re.sub(r"^HloModule \S+", "HloModule m", text, flags=re.M)
hlo_hash = hashlib.sha256(text.encode()).hexdigest()[:16]
print(json.dumps({"ready": True, "compile_s": compile_s, "hlo": hlo_hash}), flush=True)
for line in sys.stdin:
    n = int(line)
    times = []
    for _ in range(n):
        t = time.perf_counter()
        state, metrics = step(state, images, labels)
        jax.block_until_ready((state, metrics))
        times.append(time.perf_counter() - t)
    print(json.dumps({"times": times}), flush=True)
"""


def _worker(src: Path, cfg: dict) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(src.resolve() / "src"))
    env.pop("XLA_FLAGS", None)
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, json.dumps(cfg)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


def _read(proc: subprocess.Popen) -> dict:
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"worker exited with {proc.wait()}")
    return json.loads(line)


def _git_rev(src: Path) -> str:
    out = subprocess.run(
        ["git", "-C", str(src), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return out.stdout.strip() or "unknown"


def run(args) -> dict:
    cfg = {
        "model": args.model,
        "model_kwargs": json.loads(args.model_kwargs),
        "layout": args.layout,
        "algorithm": args.algorithm,
        "batch": args.batch,
        "image_shape": [int(v) for v in args.image_shape.split("x")],
        "cpu_fast": args.cpu_fast,
    }
    sides = {"a": Path(args.a), "b": Path(args.b)}
    procs = {k: _worker(p, cfg) for k, p in sides.items()}
    try:
        ready = {k: _read(p) for k, p in procs.items()}
        per_round = {"a": [], "b": []}
        for r in range(args.rounds):
            order = ("a", "b") if r % 2 == 0 else ("b", "a")
            for k in order:
                procs[k].stdin.write(f"{args.steps}\n")
                procs[k].stdin.flush()
                times = _read(procs[k])["times"]
                per_round[k].append(statistics.median(times))
    finally:
        for p in procs.values():
            p.stdin.close()
            p.wait(timeout=60)
    ratios = sorted(a / b for a, b in zip(per_round["a"], per_round["b"], strict=True))
    load = os.getloadavg()
    return {
        "config": cfg,
        "rounds": args.rounds,
        "steps_per_round": args.steps,
        "sides": {
            k: {
                "checkout": str(p),
                "rev": _git_rev(p),
                "hlo_sha256_16": ready[k]["hlo"],
                "compile_s": ready[k]["compile_s"],
                "round_medians_s": per_round[k],
                "median_s": statistics.median(per_round[k]),
                "min_s": min(per_round[k]),
                "max_s": max(per_round[k]),
            }
            for k, p in sides.items()
        },
        "same_hlo": ready["a"]["hlo"] == ready["b"]["hlo"],
        # a/b > 1: b is faster. Paired per round, so slow drift cancels.
        "paired_ratio_a_over_b": {
            "median": statistics.median(ratios),
            "min": ratios[0],
            "max": ratios[-1],
        },
        "machine": {
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_end": load,
        },
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def markdown(res: dict) -> str:
    a, b, r = res["sides"]["a"], res["sides"]["b"], res["paired_ratio_a_over_b"]
    c = res["config"]
    return "\n".join(
        [
            f"# A/B training step: {c['model']} {c['model_kwargs']} {c['layout']} "
            f"b{c['batch']} algorithm={c['algorithm']} cpu_fast={c['cpu_fast']}",
            "",
            f"{res['machine']['cpu']}, {res['machine']['cores']} cores, {res['when']}; "
            f"{res['rounds']} interleaved rounds x {res['steps_per_round']} steps.",
            "",
            "| side | rev | HLO sha256 | compile s | median step s | min | max |",
            "|---|---|---|---|---|---|---|",
            *(
                f"| {k} | {s['rev']} | {s['hlo_sha256_16']} | {s['compile_s']:.1f} | "
                f"{s['median_s']:.3f} | {s['min_s']:.3f} | {s['max_s']:.3f} |"
                for k, s in (("a", a), ("b", b))
            ),
            "",
            f"Same optimized HLO on both sides: **{res['same_hlo']}**. Paired per-round ratio "
            f"a/b (above 1: b faster): median {r['median']:.3f}, range "
            f"[{r['min']:.3f}, {r['max']:.3f}].",
            "",
        ]
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--a", required=True, help="checkout A (e.g. the previous commit)")
    p.add_argument("--b", required=True, help="checkout B (e.g. this one)")
    p.add_argument("--model", default="resnet18")
    p.add_argument("--model-kwargs", default='{"stem": "cifar"}')
    p.add_argument("--layout", default="NHWC")
    p.add_argument("--algorithm", default="xla", help="one conv algorithm for every conv")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--image-shape", default="32x32x3")
    p.add_argument("--cpu-fast", action="store_true", help="cpu_fast_options('train')")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", required=True, help="path without suffix: writes .json and .md")
    args = p.parse_args()
    res = run(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
