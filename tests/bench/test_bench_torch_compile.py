"""The bench's torch.compile rows stay compiled past dynamo's recompile limit.

Dynamo keeps one cache entry per case (model instance, shape, mode) on a model's
``forward``; past ``recompile_limit`` (8) it used to run eager silently, so a sweep's ninth
torch.compile case was timed as eager under torch.compile's name.
"""

import pytest

torch = pytest.importorskip("torch")

from layoutlab.bench.torch_runner import compiled_model  # noqa: E402


@pytest.fixture
def fresh_dynamo(monkeypatch):
    config = torch._dynamo.config
    for name in ("recompile_limit", "accumulated_recompile_limit", "fail_on_recompile_limit_hit"):
        monkeypatch.setattr(config, name, getattr(config, name))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()


class Tiny(torch.nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = torch.nn.Linear(features, 2)

    def forward(self, x):
        return torch.relu(self.linear(x))


def test_twelve_cases_are_twelve_compiled_graphs(fresh_dynamo):
    # Twelve cases as a sweep makes them, each a new instance at a shape dynamo cannot
    # reuse a graph for (static shapes; in a sweep also another memory format or mode).
    # The "eager" backend traces like inductor but skips code generation.
    for features in range(1, 13):
        compiled_model(torch, Tiny(features), backend="eager", dynamic=False)(
            torch.ones(2, features)
        )
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 12
