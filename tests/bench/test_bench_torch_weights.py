"""The bench's PyTorch rows start from the layoutlab model's initial weights, built once per
workload: every row of a workload (memory format, batch size, mode) loads the same values,
and a row that trains does not change what the next row starts from."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from flax import nnx  # noqa: E402

from layoutlab import models  # noqa: E402
from layoutlab.bench import torch_runner  # noqa: E402
from layoutlab.bench.cases import TorchCase, Workload  # noqa: E402
from layoutlab.compare.torch_weights import to_torch_state_dict  # noqa: E402

KWARGS = (("hidden", 8), ("width", 4))


def _case(mode, batch, memory_format):
    workload = Workload("small_cnn", KWARGS, (8, 8), 3, 10, mode, batch)
    return TorchCase(workload, memory_format, "fp32")


def test_rows_of_one_workload_start_from_the_layoutlab_weights_built_once(monkeypatch):
    torch_runner._layoutlab_weights.cache_clear()
    created = []
    create = models.create
    monkeypatch.setattr(models, "create", lambda *a, **k: created.append(a) or create(*a, **k))
    first = torch_runner.build_torch_model(_case("train", 4, "contiguous"), seed=3)
    # The row trains: its parameters move in place.
    with torch.no_grad():
        for p in first.parameters():
            p.add_(1.0)
    second = torch_runner.build_torch_model(_case("infer", 1, "channels_last"), seed=3)
    assert len(created) == 1
    expected = to_torch_state_dict(
        create(
            "small_cnn",
            num_classes=10,
            layout="NHWC",
            rngs=nnx.Rngs(3),
            in_channels=3,
            **dict(KWARGS),
        )
    )
    got = second.state_dict()
    assert set(got) >= set(expected)
    for key, value in expected.items():
        np.testing.assert_array_equal(got[key].numpy(), value, err_msg=key)  # exact: a copy
    # Another seed gives other weights, built anew.
    other = torch_runner.build_torch_model(_case("infer", 1, "contiguous"), seed=4)
    assert len(created) == 2
    key = "classifier.3.weight"
    assert not np.array_equal(other.state_dict()[key].numpy(), expected[key])
