"""Training-curve comparison: same init and batch order, two configurations."""

import json
import math

import pytest
from compare_helpers import fast_model

from layoutlab.compare.curves import (
    DEFAULT_ATOL,
    DEFAULT_RTOL,
    CurveReport,
    compare_curves,
    compare_training,
    parse_config,
)

DATA = "synthetic:8x8x1:10:128"


@pytest.fixture(scope="module")
def model():
    return fast_model("small_cnn", num_classes=10)


def test_layouts_train_identically(model):
    report = compare_training(model, "NHWC", "NCHW", dataset=DATA, steps=4, batch_size=16)
    assert report.passed, str(report)
    assert report.labels == ("NHWC/fp32", "NCHW/fp32")
    # Same weights, same batches, float32 both sides: only summation order differs, which
    # stays far below 1e-4 in the loss over a few steps.
    assert report.max_diff < 1e-4
    assert report.losses_a[0] == pytest.approx(math.log(10), abs=0.5)  # untrained: ~ln(10)
    assert len(set(report.losses_a)) > 1  # the model trained: the loss moved


def test_bf16_stays_in_default_band_and_a_tight_band_catches_it(model):
    report = compare_training(model, "NHWC/fp32", "NHWC/mixed_bf16", dataset=DATA, steps=4,
                              batch_size=16)  # fmt: skip
    assert report.passed, str(report)
    assert (report.rtol, report.atol) == (DEFAULT_RTOL, DEFAULT_ATOL)
    assert report.max_diff > 0.0  # bfloat16 compute does change the loss
    tight = compare_curves(report.losses_a, report.losses_b, rtol=0.0, atol=1e-9)
    assert tight.first_drift_step == 0 and not tight.passed


def test_first_drift_step_and_serialization():
    a = [2.3, 2.2, 2.1, 2.0, 1.9]
    b = [2.3, 2.21, 2.1, 2.6, float("nan")]
    report = compare_curves(a, b, rtol=0.0, atol=0.05, labels=("ref", "cand"))
    assert report.first_drift_step == 3
    assert report.drifted == (3, 4)  # NaN on one side only counts as drift
    text = str(report)
    assert "first drift at step 3" in text and "DRIFT" in text
    data = json.loads(report.to_json())
    assert data["first_drift_step"] == 3 and data["losses_b"][4] == "nan"
    again = CurveReport.from_dict(data)
    assert again.first_drift_step == 3 and again.labels == ("ref", "cand")


def test_bad_input():
    with pytest.raises(ValueError, match="different lengths"):
        compare_curves([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="rtol must be"):
        compare_curves([1.0], [1.0], rtol=-1.0)
    with pytest.raises(ValueError, match="Unknown precision policy"):
        parse_config("NHWC/fp64x")
    assert parse_config("NCHW/mixed_bf16").label == "NCHW/mixed_bf16"
    assert parse_config("mixed_fp16").loss_scale_name() == "dynamic"
