"""``layoutlab evaluate | predict --batch-size N``: how many images go through the model at
once, never what comes out. On conftest's session run (a tiny small_cnn on digits, trained
data parallel over 4 CPU devices)."""

import json

import numpy as np
import pytest
from cli_helpers import one_line_error, run_cli
from PIL import Image

import layoutlab.infer.predict as predict_module
from layoutlab.data import get_dataset
from layoutlab.infer.evaluate import evaluate_workdir
from layoutlab.infer.load import open_run
from layoutlab.infer.predict import predict_files
from layoutlab.train import read_records
from layoutlab.xla import watch_compilation

# digits has 359 test images (a prime: no batch size divides the split).
TEST_IMAGES = 359


def test_evaluate_metrics_do_not_depend_on_the_batch_size(guarantees_run, capsys):
    default = evaluate_workdir(guarantees_run)
    # The run's own batch: its metrics.jsonl figures to the bit.
    assert default["test_loss"] == read_records(guarantees_run / "metrics.jsonl")[-1]["test_loss"]
    # 7 -> 45 batches of 8 (a multiple of the 4 devices), 1 row of padding; 100 -> 4 of 92, 9.
    code, out, err = run_cli(
        capsys, "evaluate", "--workdir", guarantees_run, "--batch-size", "7", "--json"
    )
    assert code == 0, err
    for other in (json.loads(out), evaluate_workdir(guarantees_run, batch_size=100)):
        assert other["count"] == TEST_IMAGES
        # Counts are exact: every image is counted once whatever the batches.
        for key in ("test_accuracy", "test_top5_accuracy", "confusion", "per_class_accuracy"):
            assert other[key] == default[key], key
        # The loss is a float32 sum of 359 positive per-image losses in another order (and
        # on the eval plan made for the other batch, whose convs may round otherwise): its
        # rounding is at most about 6e-8 per addition in a chain, ~3e-6 for 45 host additions
        # after 3 in a batch of 8. 1e-5 bounds that and still catches one image lost or
        # counted twice (about 3e-3 of the mean).
        np.testing.assert_allclose(other["test_loss"], default["test_loss"], rtol=1e-5)


def test_predict_batches_files_by_the_batch_size_with_the_same_results(
    guarantees_run, tmp_path, monkeypatch
):
    from layoutlab.nn.conv_algos import onednn

    load = predict_module.load_images
    dataset = get_dataset("digits")
    raw = dataset.test_images[:11, ..., 0] * dataset.std[0] + dataset.mean[0]
    for i, picture in enumerate(np.clip(np.round(raw * 255), 0, 255).astype(np.uint8)):
        Image.fromarray(picture).save(tmp_path / f"{i:02d}.png")
    run = open_run(guarantees_run)
    whole = predict_files(run, [tmp_path], k=3)
    # 11 files at --batch-size 4: read and run 4 at a time (the last batch with one zero
    # image), one forward compile (and, where oneDNN's convs run, its kernel-packing program).
    read = []
    monkeypatch.setattr(
        predict_module, "load_images", lambda files, d: read.append(len(files)) or load(files, d)
    )
    with watch_compilation() as events:
        chunked = predict_files(run, [tmp_path], k=3, batch_size=4)
    # Compiled or read back from the run's cache (tests/conftest.py): one backend trip each.
    assert events.backend_compiles == 1 + onednn.available() and read == [4, 4, 3]
    assert [r["file"] for r in chunked] == [r["file"] for r in whole]
    for a, b in zip(chunked, whole, strict=True):
        assert [t["class"] for t in a["top_k"]] == [t["class"] for t in b["top_k"]]
        # Probabilities of float32 logits from another batch shape (XLA may block the matmuls
        # otherwise): a few float32 ulps of a value at most 1.
        np.testing.assert_allclose(
            [t["probability"] for t in a["top_k"]],
            [t["probability"] for t in b["top_k"]],
            atol=1e-6,
        )


@pytest.mark.parametrize("value", ["0", "-3", "eight", "2.5"])
@pytest.mark.parametrize("command", ["evaluate", "predict"])
def test_a_bad_batch_size_is_one_error_line(guarantees_run, tmp_path, capsys, command, value):
    images = [tmp_path] if command == "predict" else []
    with pytest.raises(SystemExit) as exit_info:  # argparse's own errors exit from inside
        run_cli(capsys, command, "--workdir", guarantees_run, *images, "--batch-size", value)
    assert exit_info.value.code == 2
    one_line_error(capsys.readouterr().err, "--batch-size", repr(value))
