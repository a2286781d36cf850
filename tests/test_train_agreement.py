"""The processes of a multi-process run agree before anything compiles, or all stop with one
line: two processes x two CPU devices on localhost (the launch helpers of
test_train_multihost), and the fingerprint and its comparison in-process."""

import json
import time

import pytest
from test_train_multihost import _launch, _one_line_error

from layoutlab.train.agreement import describe_differences, run_fingerprint

FAST = ["--distributed-timeout", "30"]


def _per_process(flags_of):
    """Launch flags giving process ``i`` also ``flags_of[i]`` (a list) and environment."""

    def flags(i, port):
        extra, env = flags_of[i] if isinstance(flags_of[i], tuple) else (flags_of[i], {})
        return [*extra, "--distributed", "--coordinator", f"127.0.0.1:{port}",
                "--num-processes", "2", "--process-id", str(i)], env  # fmt: skip

    return flags


# A learning rate and a conv algorithm in one launch: the line names every field that
# differs (up to four), so each must appear in it; the data's fields come in a launch of
# their own, since with them the line would pass four.
@pytest.mark.parametrize(
    "flags, words",
    [
        (
            (["--lr", "0.003"], ["--lr", "0.1", "--conv-algo", "im2col"]),
            [
                "learning_rate: 0.003 on process 0, 0.1 on process 1",
                'conv_algorithm: "auto" on process 0, "im2col" on process 1',
            ],
        ),
        (
            (["--data", "synthetic:8x8x1:10:64"], ["--data", "synthetic:8x8x1:10:96"]),
            ["data.train_size", "51 on process 0", "77 on process 1", "data.contents"],
        ),
    ],
    ids=["lr-and-conv-algo", "data"],
)
def test_processes_that_differ_stop_before_compiling(tmp_path, flags, words):
    start = time.perf_counter()
    results = _launch(tmp_path / "run", *FAST, launch_flags=_per_process(flags))
    seconds = time.perf_counter() - start
    for result in results:
        _one_line_error(result, "the processes of this run differ", *words)
    # Both say the same, and nothing was compiled or written: the check comes first.
    assert results[0][2] == results[1][2]
    assert not (tmp_path / "run" / "config.json").exists()
    assert seconds < 60, seconds


def test_conv_tune_always_is_decided_by_process_0_alone(tmp_path):
    # Each process gets its own autotune cache: only process 0 may tune (and write one).
    caches = [tmp_path / f"autotune{i}.json" for i in range(2)]
    flags = tuple(([], {"LAYOUTLAB_AUTOTUNE_CACHE": str(c)}) for c in caches)
    workdir = tmp_path / "run"
    # bfloat16: 5 candidates per conv shape instead of 8 (no Winograd F(4x4)), a cheaper tuning.
    flags_all = ["--conv-tune", "always", "--steps", "1", "--precision", "bf16",
                 "--set", "eval_batch_size=16"]  # fmt: skip
    results = _launch(workdir, *FAST, *flags_all, launch_flags=_per_process(flags))
    for code, _, err in results:
        assert code == 0, err[-2000:]
    assert "conv plan: autotuned (3 shapes (0 cached)" in results[0][1]
    assert "conv plan" not in results[1][1] and "conv plan" not in results[1][2]
    assert caches[0].is_file() and not caches[1].exists()
    # The run finished past the second check, of the plan each process compiles; the
    # plan recorded is process 0's tuning (with its measurements), one entry per conv.
    convs = json.loads((workdir / "config.json").read_text())["conv_plan"]["convs"]
    tuned = json.loads(caches[0].read_text())["entries"]
    assert len(convs) == 3 and len(tuned) == 3
    assert all("evidence" in entry for entry in convs.values()), convs


def test_duplicate_process_id_is_one_line_on_both(tmp_path):
    def flags(i, port):
        return ["--distributed", "--coordinator", f"127.0.0.1:{port}", "--num-processes",
                "2", "--process-id", "0", "--distributed-timeout", "20"]  # fmt: skip

    # The second starts once the first serves the coordinator's port, as a duplicate
    # started by mistake does. (Two started within the same instant both find the port free
    # and both time out waiting, with the join error that names --process-id.)
    results = _launch(tmp_path / "run", launch_flags=flags, serve_first=True)
    words = {r[2].strip().split(":")[1].split()[0] for r in results}
    for result in results:
        _one_line_error(result)
    # The second finds the coordinator's port taken; the first waits for a
    # process 1 that never comes. Its wait is 20 s so that it still holds the port when the
    # second, started after it, reaches its check on a loaded 2-core machine.
    joined = " ".join(r[2] for r in results)
    assert "another process was started with --process-id 0" in joined, joined
    assert words == {"port", "could"}, words


def _fingerprint(*overrides, data="synthetic:8x8x1:10:64"):
    from flax import nnx

    from layoutlab.train.config import TrainConfig, apply_overrides, validate
    from layoutlab.train.loop import build_model, make_step_schedule
    from layoutlab.train.run_data import load_run_data

    config = validate(apply_overrides(TrainConfig(data=data), list(overrides)), 1)
    dataset = load_run_data(config)
    model = nnx.eval_shape(lambda: build_model(config, dataset))
    return run_fingerprint(config, dataset, make_step_schedule(config, dataset), model)


def test_fingerprint_compares_resolved_values():
    base = _fingerprint("learning_rate=0.1", "layout=nhwc", "model_kwargs.width=4")
    same = _fingerprint("learning_rate=1e-1", "layout=NHWC", "model_kwargs.width=4")
    assert describe_differences([base, same]) is None
    wider = _fingerprint("learning_rate=0.1", "model_kwargs.width=8")
    line = describe_differences([base, same, wider])
    # Only process 2 differs: its width, and the model state that follows from it.
    assert line.startswith("model_kwargs: {\"width\": 4} on process 0, {\"width\": 8} on "
                           "process 2; model state ("), line  # fmt: skip
    assert "process 1" not in line and "\n" not in line


def test_supervisor_holds_back_a_fatal_trace_and_names_its_reason():
    import io
    import os

    from layoutlab.train.supervise import _fatal_message, _pass_through

    read, write = os.pipe()
    os.write(write, b"W1125 06:00:00.000001 1 a.cc:1] a warning\nprogress 50%\rprogress 90%\r"
                    b"F1125 06:46:42.051416   28951 client.h:80] Terminating process. "
                    b"absl::Status: UNAVAILABLE: Failed to send RPC\n*** Check failure stack "
                    b"trace: ***\n    @ 0x7f36b8240634 absl::LogMessage\n")  # fmt: skip
    os.close(write)
    out = io.BytesIO()
    with os.fdopen(read, "rb") as stream:
        held = _pass_through(stream, out)
    # Everything before the fatal line passes as it came; the trace is held back.
    assert (
        out.getvalue() == b"W1125 06:00:00.000001 1 a.cc:1] a warning\nprogress 50%\rprogress 90%\r"
    )
    assert _fatal_message(held) == "UNAVAILABLE: Failed to send RPC"
