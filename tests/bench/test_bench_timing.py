"""The timing primitives: AOT compile apart, blocked calls, and the recompilation guard."""

import jax.numpy as jnp
import pytest

from layoutlab.bench.timing import JaxStep, RecompilationError, summarize


def test_compile_reports_xla_cost_and_memory():
    a = jnp.ones((8, 8), jnp.float32)
    step = JaxStep(lambda x, y: x @ y, (a, a), backend="cpu")
    fields = step.compile()
    assert fields["compile_s"] > 0
    # An 8x8 @ 8x8 matmul is 8*8*8 multiply-adds = 2 * 8**3 flops.
    assert fields["flops"] == 2 * 8**3
    # Two float32 8x8 arguments.
    assert fields["argument_bytes"] == 2 * 8 * 8 * 4
    assert fields["transposes"] == 0 and fields["converts"] == 0


def test_stable_step_is_traced_once_and_carries_its_state():
    step = JaxStep(
        lambda s: (s + 1, s * 2), (jnp.zeros((), jnp.int32),), donate_argnums=(0,), carry=0
    )
    step.compile()
    for _ in range(5):
        step()
    assert step.traces == 1
    # The carried counter went 0 -> 5; the second output is 2 * (value before the call).
    new_state, doubled = step.outputs
    assert int(new_state) == 5 and int(doubled) == 8


def test_guard_fails_a_step_that_retraces():
    # The state comes back as float32 while it went in as int32: the next call's
    # signature differs, so jit would trace and compile again on every dtype change.
    step = JaxStep(
        lambda s: (s.astype(jnp.float32) + jnp.float32(1),), (jnp.zeros((), jnp.int32),), carry=0
    )
    step.compile()
    step()  # same signature as compiled: fine
    with pytest.raises(RecompilationError, match="traced again"):
        step()


def test_call_before_compile_is_refused():
    step = JaxStep(lambda x: x + 1, (jnp.zeros((2,), jnp.float32),))
    with pytest.raises(RuntimeError, match="compile"):
        step()


def test_summarize_median_min_max_in_ms():
    stats = summarize([0.003, 0.001, 0.002, 0.010])
    assert stats.median_ms == pytest.approx(2.5)
    assert (stats.min_ms, stats.max_ms, stats.repeats) == (pytest.approx(1.0), 10.0, 4)
    with pytest.raises(ValueError):
        summarize([])


def test_interleaved_rounds_rotate_the_order_when_asked():
    from layoutlab.bench.timing import interleaved_rounds

    seen = []
    calls = {k: (lambda k=k: seen.append(k)) for k in "ABC"}
    rounds = interleaved_rounds(calls, repeats=4, warmup=0)
    assert "".join(seen) == "ABC" * 4 and all(len(v) == 4 for v in rounds.values())
    seen.clear()
    rounds = interleaved_rounds(calls, repeats=4, warmup=1, rotate=True)
    # One warm-up call each, then rounds A B C, B C A, C A B, A B C: each call follows every
    # other one equally often, and round i of every call is still its i-th time.
    assert "".join(seen) == "ABC" + "ABC" + "BCA" + "CAB" + "ABC"
    assert list(rounds) == ["A", "B", "C"] and all(len(v) == 4 for v in rounds.values())


def test_settle_waits_until_the_process_is_idle_and_no_longer():
    from layoutlab.bench.timing import QUIET_CORES, SETTLE_MAX_S, SETTLE_WINDOW_S, settle

    class Fake:
        """A clock and a CPU-time meter: threads burn ``busy_cores`` until ``busy_until``."""

        def __init__(self, busy_until, busy_cores=1.0):
            self.now, self.cpu_s = 0.0, 0.0
            self.busy_until, self.busy_cores = busy_until, busy_cores

        def sleep(self, s):
            busy = max(0.0, min(self.now + s, self.busy_until) - self.now)
            self.cpu_s += busy * self.busy_cores + s * 0.01  # a sleeping process's own crumbs
            self.now += s

    # One spinning worker for 10 ms (what PyTorch's libgomp leaves after a call): settle
    # returns in the first window that is idle, one window after the spin ends.
    f = Fake(busy_until=0.010)
    waited = settle(lambda: f.cpu_s, lambda: f.now, f.sleep)
    assert 0.010 <= waited <= 0.010 + 2 * SETTLE_WINDOW_S
    # Idle already: one window.
    f = Fake(busy_until=0.0)
    assert settle(lambda: f.cpu_s, lambda: f.now, f.sleep) == pytest.approx(SETTLE_WINDOW_S)
    # Busy for good (a thread of the process's own at work): it gives up at the cap.
    f = Fake(busy_until=1e9, busy_cores=QUIET_CORES * 2)
    waited = settle(lambda: f.cpu_s, lambda: f.now, f.sleep)
    assert SETTLE_MAX_S <= waited < SETTLE_MAX_S + SETTLE_WINDOW_S + 1e-9


def test_settle_sees_a_real_spinning_thread():
    import threading
    import time

    from layoutlab.bench.timing import settle

    def spin(until):
        while time.perf_counter() < until:
            pass

    # A thread that burns a core for 40 ms: settle must wait most of that. The bound leaves
    # 20 ms for the thread to start and for the scheduler on a loaded 2-core machine. settle
    # reads 2 ms windows of this process's CPU time, so one window in which the scheduler
    # ran the suite's other worker instead of the spinner ends its wait early (12 ms once in
    # a clean-clone run): the best of three tries. A settle that never waits fails all three;
    # one that always waits fails the fake-clock test above (idle: one window).
    waits = []
    for _ in range(3):
        t = threading.Thread(target=spin, args=(time.perf_counter() + 0.040,))
        t.start()
        waits.append(settle())
        t.join()
        if waits[-1] >= 0.020:
            break
    assert max(waits) >= 0.020, waits


def test_interleaved_rounds_call_quiet_before_each_measured_call():
    from layoutlab.bench.timing import interleaved_rounds

    seen = []
    calls = {k: (lambda k=k: seen.append(k)) for k in "AB"}
    interleaved_rounds(calls, repeats=2, warmup=1, quiet=lambda: seen.append("."))
    assert "".join(seen) == "AB" + ".A.B" * 2


def test_block_rounds_time_blocks_after_a_lead_call():
    """Each round calls every case ``block`` + 1 times (a lead call, then the timed block),
    after ``warmup`` calls each; one time per case per round."""
    from layoutlab.bench.timing import block_rounds

    counts = {"a": 0, "b": 0}

    def call(name):
        def run():
            counts[name] += 1

        return run

    times = block_rounds({k: call(k) for k in counts}, rounds=3, block=4, warmup=2)
    assert counts == {"a": 2 + 3 * 5, "b": 2 + 3 * 5}
    assert {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3}
    assert all(t >= 0 for v in times.values() for t in v)
