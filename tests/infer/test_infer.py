"""``load_model`` and ``layoutlab evaluate | predict | export`` on one trained digits run.

The module trains small_cnn on digits for 2 epochs once (checkpoints at steps 44 and 88,
about 97% test accuracy), under conftest's 4 CPU devices, so the run and every evaluation
here are data parallel as training was.
"""

import dataclasses
import json
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx
from PIL import Image

from layoutlab import cli, load_model
from layoutlab.data import get_dataset
from layoutlab.infer.evaluate import evaluate_workdir
from layoutlab.infer.load import NoRunError, checkpoint_state, jitted_flat_forward, open_run
from layoutlab.infer.predict import load_images
from layoutlab.nn import BatchNorm
from layoutlab.nn.conv_config import planned_entries
from layoutlab.train import (
    IncompatibleCheckpointError,
    TrainConfig,
    read_checkpoint,
    read_records,
    train_and_evaluate,
)
from layoutlab.train.steps import make_forward

# A program compiled twice here (the loop's eval step, which evaluate runs again on the
# restored state) is read back from the run's compilation cache the second time.
pytestmark = pytest.mark.usefixtures("shared_compiles")

STEPS_PER_EPOCH = 44  # 1438 digits train images in batches of 32


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("infer") / "run"
    config = TrainConfig(model="small_cnn", data="digits", epochs=2, seed=0)
    train_and_evaluate(config, workdir, quiet=True)
    return workdir


def _cli(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _assert_error(result, *words):
    code, out, err = result
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for word in words:
        assert word in lines[0], lines[0]


# --- evaluate -------------------------------------------------------------------------------


def test_evaluate_reproduces_the_runs_test_metrics_exactly(run_dir):
    records = read_records(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == [STEPS_PER_EPOCH, 2 * STEPS_PER_EPOCH]
    for record, step in ((records[-1], None), (records[0], STEPS_PER_EPOCH)):
        result = evaluate_workdir(run_dir, step)
        assert result["step"] == record["step"]
        # The training loop's own eval step on the restored state: equal, not close.
        assert result["test_loss"] == record["test_loss"]
        assert result["test_accuracy"] == record["test_accuracy"]
    confusion = np.asarray(result["confusion"])
    test_labels = get_dataset("digits").test_labels
    assert confusion.shape == (10, 10) and confusion.sum() == test_labels.size == result["count"]
    np.testing.assert_array_equal(confusion.sum(axis=1), np.bincount(test_labels, minlength=10))
    # The extras come from a second program's logits; their argmax agrees with the eval step.
    assert np.trace(confusion) == round(record["test_accuracy"] * test_labels.size)
    per_class = np.diag(confusion) / confusion.sum(axis=1)
    np.testing.assert_array_equal(result["per_class_accuracy"], per_class)
    assert record["test_accuracy"] <= result["test_top5_accuracy"] <= 1.0
    assert result["class_names"] == [str(d) for d in range(10)]


def test_the_eval_step_runs_the_table_plan_of_the_eval_batch(run_dir):
    # digits has 359 test images, fewer than the eval batch (512): one batch, padded to 360
    # to split over the 4 devices (train.evaluation.eval_batches), which the training plan
    # (keyed at batch 32) would not match. The loop's eval step and evaluate's (whose
    # metrics equal the loop's, above) run eval_conv_plan instead.
    config = json.loads((run_dir / "config.json").read_text())

    def batches(plan):
        return {e["spec_key"].split(":")[1] for e in plan["convs"].values()}

    assert batches(config["conv_plan"]) == {"n32"}
    assert batches(config["eval_conv_plan"]) == {"n360"}
    sources = [e["evidence"]["source"] for e in config["eval_conv_plan"]["convs"].values()]
    assert sources and all(s.startswith("default table") for s in sources)
    run = open_run(run_dir)
    model = nnx.merge(run.eval_defs.eval, run.params, run.model_state)
    got = {p: e.spec_key for p, e in planned_entries(model).items()}
    assert got == {p: e["spec_key"] for p, e in config["eval_conv_plan"]["convs"].items()}


def test_evaluate_cli_prints_and_writes_json_and_png(run_dir, tmp_path, capsys):
    out_json = tmp_path / "eval.json"
    code, out, err = _cli(
        capsys,
        "evaluate",
        "--workdir",
        run_dir,
        "--json-file",
        out_json,
        "--out",
        tmp_path / "plots",
    )
    assert code == 0, err
    last = read_records(run_dir / "metrics.jsonl")[-1]
    result = json.loads(out_json.read_text())
    assert result["test_loss"] == last["test_loss"]  # JSON floats round-trip exactly
    assert result["test_accuracy"] == last["test_accuracy"]
    assert f"test_accuracy {last['test_accuracy']:.6f}" in out
    assert "confusion matrix (rows: true class" in out and "per-class accuracy:" in out
    png = tmp_path / "plots" / f"confusion_step{last['step']}.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_evaluate_on_another_data_set_of_the_same_shape(run_dir):
    spec = "synthetic:8x8x1:10:80"
    result = evaluate_workdir(run_dir, data=spec)
    other = get_dataset(spec)
    assert result["data"] == other.name and result["count"] == other.test_labels.size == 16
    confusion = np.asarray(result["confusion"])
    np.testing.assert_array_equal(
        confusion.sum(axis=1), np.bincount(other.test_labels, minlength=10)
    )
    assert np.trace(confusion) == round(result["test_accuracy"] * 16)


def test_evaluate_cli_on_another_data_set_keeps_the_runs_plot(run_dir, tmp_path, capsys):
    # --json prints the results as JSON; the other data set's plot is named after it, so
    # it cannot replace the plot of the run's own test split in the same --out.
    code, out, err = _cli(
        capsys, "evaluate", "--workdir", run_dir, "--data", "synthetic:8x8x1:10:80", "--json",
        "--out", tmp_path,
    )  # fmt: skip
    assert code == 0, err
    step = json.loads(out)["step"]
    assert [p.name for p in tmp_path.glob("*.png")] == [
        f"confusion_step{step}_synthetic_8x8x1_10_80.png"
    ]


# --- load_model -----------------------------------------------------------------------------


def test_load_model_matches_the_eval_forward_and_converts_layout(run_dir):
    run = open_run(run_dir)
    images = run.dataset.test_images[:16]
    want = np.asarray(jax.jit(make_forward(run.defs))(run.state(), images))
    model = load_model(run_dir)
    norms = [n for _, n in nnx.iter_graph(model) if isinstance(n, BatchNorm)]
    assert norms and all(n.use_running_average for n in norms)  # eval mode
    got = np.asarray(model(images))
    # Eager op-by-op vs one jitted program: same float32 math, reassociated by fusion; logits
    # are O(10), so 1e-5 is ~10 float32 ulps of them.
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(model(images)), got)  # eval: no state change
    nchw = load_model(run_dir, layout="NCHW")
    # Same weights, transposed kernels and inputs: conv sums reassociate, as above. Jitted:
    # the eager call is checked above, and op by op each op would compile again in NCHW.
    got_nchw = jax.jit(lambda x: nchw(x))(images.transpose(0, 3, 1, 2))
    np.testing.assert_allclose(np.asarray(got_nchw), got, rtol=0, atol=1e-5)


def test_run_logits_is_the_eval_forward_on_the_runs_state(run_dir):
    # predict's forward takes the state's leaves flattened once; the program is the same
    # make_forward (on the conv plan of its batch: tests/infer/test_infer_plan.py) with the run's
    # inference options, so its logits equal that jitted call's bit for bit (the numerics
    # against eager are checked above).
    run = open_run(run_dir)
    images = run.dataset.test_images[:4]
    options = dict(run.spec.compile_options("infer")) or None
    forward = make_forward(run.inference_defs(images))
    want = jax.jit(forward, compiler_options=options)(run.state(), images)
    np.testing.assert_array_equal(np.asarray(run.logits(images)), np.asarray(want))
    # One compiled program per model, plan and options: the run opened again reuses it.
    hits = jitted_flat_forward.cache_info().hits
    open_run(run_dir).logits(images)
    assert jitted_flat_forward.cache_info().hits == hits + 1


# --- predict --------------------------------------------------------------------------------


def _pixels(dataset, index):
    """The 8-bit grayscale picture of a test image (undoing the normalization)."""
    raw = dataset.test_images[index, ..., 0] * dataset.std[0] + dataset.mean[0]
    return np.clip(np.round(raw * 255), 0, 255).astype(np.uint8)


def test_predict_gives_the_labels_of_saved_upscaled_digits(run_dir, tmp_path, capsys):
    dataset = get_dataset("digits")
    folder = tmp_path / "digits"
    folder.mkdir()
    n = 12
    for i in range(n):  # 8x8 -> 32x32: predict must resize them back
        picture = Image.fromarray(_pixels(dataset, i)).resize((32, 32), Image.Resampling.NEAREST)
        picture.save(folder / f"{i:02d}.png")
    rgb = tmp_path / "rgb.png"  # a colour file: converted to the model's one channel
    Image.fromarray(_pixels(dataset, n)).convert("RGB").resize((20, 20)).save(rgb)
    code, out, err = _cli(
        capsys, "predict", "--workdir", run_dir, folder, rgb, "--top-k", "3", "--json"
    )
    assert code == 0, err
    results = json.loads(out)
    assert [r["file"] for r in results] == [str(folder / f"{i:02d}.png") for i in range(n)] + [
        str(rgb)
    ]
    predicted = [r["top_k"][0]["class"] for r in results]
    np.testing.assert_array_equal(predicted, dataset.test_labels[: n + 1])
    for r in results:
        assert [t["name"] for t in r["top_k"]] == [str(t["class"]) for t in r["top_k"]]
        probs = [t["probability"] for t in r["top_k"]]
        assert len(probs) == 3 and probs == sorted(probs, reverse=True) and sum(probs) <= 1
    code, out, _ = _cli(capsys, "predict", "--workdir", run_dir, rgb)
    assert code == 0 and out.startswith(f"{rgb}: {dataset.test_labels[n]} ")
    # The same run opened again predicts one image without compiling its forward again.
    from layoutlab.infer import open_run, predict_files
    from layoutlab.xla import watch_compilation

    with watch_compilation() as events:
        again = predict_files(open_run(run_dir), [rgb], k=3)
    # Nor read back from the run's compilation cache: this process still holds it.
    assert events.backend_compiles == 0 and events.cache_hit is None
    assert again[0]["top_k"][0]["class"] == dataset.test_labels[n]
    # With an eval batch of 5, the 13 files go in 3 chunks of 5, the last with 2 zero images
    # (train.evaluation.eval_batches): one batch shape, so one forward compile (chunks of 5,
    # 5 and 3 would compile two), and 13 results. Where oneDNN's convs run, the program that
    # packs their kernels once for that shape (nn.conv_algos.onednn_packed) compiles too.
    from layoutlab.nn.conv_algos import onednn

    run = open_run(run_dir)
    run = dataclasses.replace(run, config=dataclasses.replace(run.config, eval_batch_size=5))
    with watch_compilation() as events:
        chunked = predict_files(run, sorted(folder.iterdir()) + [rgb], k=3)
    # A program compiled or read back from the run's cache counts once either way: jax times
    # both as one backend trip (watch_compilation).
    assert events.backend_compiles == 1 + onednn.available()
    assert [r["file"] for r in chunked] == [r["file"] for r in results]
    for a, b in zip(chunked, results, strict=True):
        assert [t["class"] for t in a["top_k"]] == [t["class"] for t in b["top_k"]]


def test_predict_normalizes_exactly_like_the_folder_loader(tmp_path):
    """Files read by predict equal the folder data set's arrays bit for bit."""
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for name in ("cat", "dog"):
            d = tmp_path / split / name
            d.mkdir(parents=True)
            for i in range(3):
                Image.fromarray(rng.integers(0, 256, (6, 5, 3), np.uint8)).save(d / f"{i}.png")
    # A grayscale file among colour ones is converted to RGB by both.
    Image.fromarray(rng.integers(0, 256, (6, 5), np.uint8)).save(tmp_path / "test/dog/3.png")
    dataset = get_dataset(f"folder:{tmp_path}")
    files = sorted((tmp_path / "test").rglob("*.png"))  # the loader's order: class, then name
    np.testing.assert_array_equal(load_images(files, dataset), dataset.test_images)


# --- export ---------------------------------------------------------------------------------

# Runs in a fresh interpreter that imports JAX and NumPy only: no layoutlab model code.
# Called with the artifact, then input and output files in pairs.
RELOAD = """
import sys
import jax, numpy as np
exported = jax.export.deserialize(open(sys.argv[1], "rb").read())
for x, y in zip(sys.argv[2::2], sys.argv[3::2], strict=True):
    np.save(y, np.asarray(exported.call(np.load(x))))
assert not [m for m in sys.modules if m.startswith(("layoutlab", "flax"))]
"""


def test_export_round_trip_in_a_fresh_process(run_dir, tmp_path, capsys):
    artifact = tmp_path / "model.jax"
    code, out, err = _cli(
        capsys, "export", "--workdir", run_dir, "--out", artifact, "--platforms", "cpu"
    )
    assert code == 0, err
    sidecar = json.loads((tmp_path / "model.jax.json").read_text())
    assert sidecar["input"] == {
        "shape": ["symbolic", 8, 8, 1],
        "layout": "NHWC",
        "dtype": "float32",
    }
    assert sidecar["class_names"] == [str(d) for d in range(10)]
    run = open_run(run_dir)
    assert sidecar["normalization"]["mean"] == list(run.dataset.mean)
    forward = jax.jit(make_forward(run.defs))
    batches = (3, 17)  # one artifact, two batch sizes, in one fresh process
    files = []
    for batch in batches:
        np.save(tmp_path / f"x{batch}.npy", run.dataset.test_images[:batch])
        files += [tmp_path / f"x{batch}.npy", tmp_path / f"y{batch}.npy"]
    proc = subprocess.run(
        [sys.executable, "-c", RELOAD, artifact, *files],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    for batch in batches:
        want = np.asarray(forward(run.state(), run.dataset.test_images[:batch]))
        # The artifact is the same forward lowered with a symbolic batch; the compiled
        # program may fuse differently than the concrete-batch one, so allow ~10 ulps of
        # logits of size O(10).
        np.testing.assert_allclose(np.load(tmp_path / f"y{batch}.npy"), want, rtol=0, atol=1e-5)


def test_export_rejects_inputs_of_the_wrong_shape(run_dir, tmp_path, capsys):
    """What a caller of the artifact sees: jax.export's ValueError naming both shapes."""
    code, _, err = _cli(
        capsys, "export", "--workdir", run_dir, "--out", tmp_path / "b4.jax", "--batch-size", "4"
    )
    assert code == 0, err
    fixed = jax.export.deserialize((tmp_path / "b4.jax").read_bytes())
    assert fixed.platforms == ("cpu", "cuda")
    with pytest.raises(ValueError, match=r"expected \(4, 8, 8, 1\) and called with \(5, 8, 8, 1\)"):
        fixed.call(np.zeros((5, 8, 8, 1), np.float32))
    with pytest.raises(ValueError, match=r"called with \(4, 16, 16, 1\)"):
        fixed.call(np.zeros((4, 16, 16, 1), np.float32))


@pytest.mark.torch
def test_export_torch_state_dict(run_dir, tmp_path, capsys):
    torch = pytest.importorskip("torch")
    from layoutlab.compare.torch_weights import to_torch_state_dict

    pth = tmp_path / "model.pth"
    code, _, err = _cli(
        capsys, "export", "--workdir", run_dir, "--out", tmp_path / "m.jax",
        "--platforms", "cpu", "--torch-state-dict", pth,
    )  # fmt: skip
    assert code == 0, err
    saved = torch.load(pth, weights_only=True)
    want = to_torch_state_dict(load_model(run_dir))
    assert saved.keys() == want.keys()
    for key, value in want.items():
        np.testing.assert_array_equal(saved[key].numpy(), value, err_msg=key)


# --- bad input ------------------------------------------------------------------------------


def test_bad_workdirs_and_checkpoints(run_dir, tmp_path, capsys):
    _assert_error(_cli(capsys, "evaluate", "--workdir", tmp_path / "nope"), "does not exist")
    empty = tmp_path / "empty"
    empty.mkdir()
    _assert_error(_cli(capsys, "predict", "--workdir", empty, "x.png"), "config.json")
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    shutil.copy(run_dir / "config.json", fresh)
    _assert_error(_cli(capsys, "export", "--workdir", fresh, "--out", tmp_path / "m"), "train")
    with pytest.raises(NoRunError, match="no checkpoint"):
        load_model(fresh)
    _assert_error(
        _cli(capsys, "evaluate", "--workdir", run_dir, "--checkpoint", "7"),
        "No checkpoint for step 7",
        "[44, 88]",
    )
    # Another model's checkpoint under this run's config.json: a wider small_cnn.
    other = tmp_path / "other"
    shutil.copytree(run_dir / "checkpoints", other / "checkpoints")
    config = json.loads((run_dir / "config.json").read_text())
    config["model_kwargs"] = {"width": 8}
    (other / "config.json").write_text(json.dumps(config))
    _assert_error(
        _cli(capsys, "evaluate", "--workdir", other),
        "written with model_kwargs={}",
        "config.json has model_kwargs={'width': 8}",
    )
    with pytest.raises(IncompatibleCheckpointError, match="belongs to another run"):
        load_model(other)


def test_checkpoint_arrays_are_checked_one_by_one(run_dir):
    """Without the writer's config to compare, every array's shape and dtype still is."""
    run = open_run(run_dir)
    arrays, meta = read_checkpoint(run_dir / "checkpoints")
    del meta["extra"]
    params, model_state = checkpoint_state(arrays, meta, run.params, run.model_state, "ckpt")

    def data(x):
        return jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x

    got, want = (
        jax.tree.leaves((params, model_state)),
        jax.tree.leaves((run.params, run.model_state)),
    )
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(data(g), data(w))
    kernel = ".params['classifier']['layers'][3]['kernel'].value"
    wrong = {**arrays, kernel: arrays[kernel][:, :5]}
    with pytest.raises(IncompatibleCheckpointError, match=r"float32\[128, 5\] where"):
        checkpoint_state(wrong, meta, run.params, run.model_state, "ckpt")
    wrong = {**arrays, kernel: arrays[kernel].astype(np.float16)}
    with pytest.raises(IncompatibleCheckpointError, match="float16"):
        checkpoint_state(wrong, meta, run.params, run.model_state, "ckpt")
    del arrays[kernel]
    with pytest.raises(IncompatibleCheckpointError, match="has no .params"):
        checkpoint_state(arrays, meta, run.params, run.model_state, "ckpt")


def test_bad_predict_and_export_arguments(run_dir, tmp_path, capsys):
    broken = tmp_path / "broken.png"
    broken.write_text("not an image")
    _assert_error(_cli(capsys, "predict", "--workdir", run_dir, broken), str(broken))
    _assert_error(_cli(capsys, "predict", "--workdir", run_dir, tmp_path / "gone.png"), "gone")
    _assert_error(_cli(capsys, "predict", "--workdir", run_dir, tmp_path, "--top-k", "0"), "top-k")
    # digits has 10 classes: 11 is refused rather than silently cut to 10
    _assert_error(
        _cli(capsys, "predict", "--workdir", run_dir, tmp_path, "--top-k", "11"), "top-k 10"
    )
    missing = tmp_path / "missing" / "dir" / "m.jax"
    _assert_error(_cli(capsys, "export", "--workdir", run_dir, "--out", missing), "does not exist")
    assert not (tmp_path / "missing").exists()
    out = tmp_path / "m.jax"
    _assert_error(
        _cli(capsys, "export", "--workdir", run_dir, "--out", out, "--batch-size", "0"), "0"
    )
    _assert_error(
        _cli(capsys, "export", "--workdir", run_dir, "--out", out, "--platforms", "gpu"), "gpu"
    )
    _assert_error(
        _cli(capsys, "evaluate", "--workdir", run_dir, "--data", "synthetic:8x8x3"), "classes"
    )
    assert not out.exists()


def test_nchw_mixed_precision_run_with_hwio_kernels(tmp_path, capsys):
    """The run's layout, policy and kernel storage all come back through build_model."""
    workdir = tmp_path / "nchw"
    config = TrainConfig(
        model="small_cnn",
        model_kwargs={"width": 4, "hidden": 16},
        layout="NCHW",
        precision="mixed_bf16",
        kernel_storage="channels_last",
        num_steps=3,
        # LLVM's level 0 for the run's programs (its steps, and evaluate's, which reads the
        # run's options): each comparison here is between layoutlab's own programs, and the
        # run's training step and eval step compile about 2x faster.
        xla_options={"xla_backend_optimization_level": 0},
    )
    record = train_and_evaluate(config, workdir, quiet=True)
    result = evaluate_workdir(workdir)
    assert (result["test_loss"], result["test_accuracy"]) == (
        record["test_loss"],
        record["test_accuracy"],
    )
    model = load_model(workdir)
    assert model.features.layers[0].layers[0].kernel.shape == (3, 3, 1, 4)  # HWIO storage
    images = open_run(workdir).dataset.test_images[:5]
    # Jitted (op by op, each bfloat16 op of the model would compile on its own).
    logits = jax.jit(lambda x: model(x))(images.transpose(0, 3, 1, 2))
    assert logits.shape == (5, 10)
    code, _, err = _cli(
        capsys, "export", "--workdir", workdir, "--out", tmp_path / "m.jax", "--platforms", "cpu"
    )
    assert code == 0, err
    sidecar = json.loads((tmp_path / "m.jax.json").read_text())
    assert sidecar["input"]["shape"] == ["symbolic", 1, 8, 8]
    assert sidecar["input"]["layout"] == "NCHW"
    exported = jax.export.deserialize((tmp_path / "m.jax").read_bytes())
    assert sidecar["output"]["dtype"] == str(exported.out_avals[0].dtype) == str(logits.dtype)
    want = np.asarray(logits, np.float32)
    got = np.asarray(exported.call(images.transpose(0, 3, 1, 2)), np.float32)
    # The same bf16-compute program up to fusion (equal in practice): allow two bf16
    # roundings (2**-8 relative each) of the largest logit.
    np.testing.assert_allclose(got, want, rtol=0, atol=2 * 2**-8 * np.abs(want).max())
