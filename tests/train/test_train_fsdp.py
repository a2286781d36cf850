"""``param_sharding="fsdp"``: parameters and optimizer state split over the data axis.

Four fake CPU devices (tests/conftest.py): each device holds about a quarter of the state
(read from the arrays' own shardings), and a few steps match the replicated run.
"""

import jax
import numpy as np
import pytest

from layoutlab import models
from layoutlab.train import TrainConfig, train_and_evaluate
from layoutlab.train.checkpoint import read_checkpoint
from layoutlab.train.config import validate
from layoutlab.train.program import INIT_COMPILER_OPTIONS, build_program
from layoutlab.train.run_data import load_run_data
from layoutlab.train.sharding import make_shardings, state_shardings
from layoutlab.train.spec import InputSpec, resolve_spec
from layoutlab.train.step_schedule import make_step_schedule

pytestmark = pytest.mark.usefixtures("shared_compiles")

# Both sides of every comparison are layoutlab's own programs (the fsdp run against the
# replicated one), so they compile at LLVM level 0 (docs/development.md): the same HLO passes
# and partitioning, less CPU. The run's init then compiles with the same options as
# _per_device_bytes's, and the runs read those two programs back from the module's cache.
BASE = TrainConfig(model_kwargs=models.spec("small_cnn").tiny, batch_size=16, num_steps=4,
                   eval_every=2, seed=1,
                   xla_options={"xla_backend_optimization_level": 0})  # fmt: skip


def _per_device_bytes(config):
    config = validate(config, jax.device_count())
    dataset = load_run_data(config)
    total_steps = make_step_schedule(config, dataset).total_steps
    spec = resolve_spec(config, total_steps, jax.device_count())
    program = build_program(spec, InputSpec.of(dataset, spec.batch_size))
    shard = make_shardings(True)
    shardings = state_shardings(jax.eval_shape(program.init), shard, config.param_sharding)
    # Compiled as the loop compiles a fresh run's init (the run's options at optimization
    # level 0): the run's own state, in half the compile time of the default options.
    options = {**program.spec.compile_options("train"), **INIT_COMPILER_OPTIONS}
    state = jax.jit(program.init, out_shardings=shardings).lower().compile(options)()
    per_device = {}
    for leaf in jax.tree.leaves(state):
        for s in leaf.addressable_shards:
            per_device[s.device] = per_device.get(s.device, 0) + s.data.nbytes
    total = sum(x.nbytes for x in jax.tree.leaves(state) if hasattr(x, "nbytes"))
    return per_device, total


def test_fsdp_holds_about_a_quarter_of_the_state_per_device():
    assert jax.device_count() == 4
    replicated, total = _per_device_bytes(BASE)
    fsdp, _ = _per_device_bytes(TrainConfig(**{**BASE.to_dict(), "param_sharding": "fsdp"}))
    assert len(fsdp) == 4 and all(v == total for v in replicated.values())
    # Small arrays whose axes do not divide by 4 (a 10-class bias) stay whole: about N-fold,
    # not exactly.
    for device_bytes in fsdp.values():
        assert device_bytes < 0.3 * total, (device_bytes, total)


def test_fsdp_steps_match_the_replicated_run(tmp_path):
    train_and_evaluate(BASE, tmp_path / "rep", quiet=True)
    fsdp = TrainConfig(**{**BASE.to_dict(), "param_sharding": "fsdp"})
    train_and_evaluate(fsdp, tmp_path / "fsdp", quiet=True)
    a, _ = read_checkpoint(tmp_path / "rep" / "checkpoints")
    b, _ = read_checkpoint(tmp_path / "fsdp" / "checkpoints")
    # Same math; XLA partitions the matmuls and convs differently (reduce-scatter and
    # all-gather instead of one all-reduce), which reorders float32 sums: ~1e-7 per step.
    for path in a:
        if a[path].dtype.kind == "f":
            np.testing.assert_allclose(b[path], a[path], rtol=1e-5, atol=1e-6, err_msg=path)


def test_bad_param_sharding_is_refused():
    with pytest.raises(ValueError, match="param_sharding must be"):
        validate(TrainConfig(param_sharding="zero3"), 4)
