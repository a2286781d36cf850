"""argparse's own errors read like every other bad input: one ``error:`` line, exit 2; a closed
output pipe ends a command quietly."""

import os
import subprocess
import sys

import pytest
from test_cli_fast_start import _command_paths

from layoutlab import cli

# A missing value, a bad choice and a missing positional, besides the unknown flag every
# command gets below.
CASES = [
    ["nosuchcommand"],
    ["train", "--lr"],
    ["train", "--layout", "NWHC"],
    ["predict", "--workdir", "RUN"],
    ["bench", "--model", "small_cnn"],
    ["autotune", "convs", "--model", "small_cnn"],
]


def _one_line_error(argv, capsys):
    try:
        code = cli.main(argv)
    except SystemExit as e:  # argparse's own errors exit from inside parse_args
        code = e.code
    err = capsys.readouterr().err
    assert code == 2, (argv, err)
    # `layoutlab autotune --flag` is the deprecated spelling of `autotune layout`, which
    # says so in its own warning line before the error.
    lines = [x for x in err.strip().splitlines() if not x.startswith("warning: ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), (argv, err)
    return lines[0]


@pytest.mark.parametrize("argv", CASES, ids=" ".join)
def test_argparse_errors_are_one_line(argv, capsys):
    _one_line_error(argv, capsys)


def test_every_command_rejects_an_unknown_flag_in_one_line(capsys):
    paths = sorted(set(_command_paths()))
    assert len(paths) > 10
    for path in paths:
        line = _one_line_error([*path, "--no-such-flag"], capsys)
        # argparse names missing required arguments before unknown ones; either way the line
        # names the command's --help, which lists the right spellings
        assert "--no-such-flag" in line or "are required" in line, line
        assert "--help'" in line, line
        if "--no-such-flag" in line:  # reported by the command it was given to
            assert f"'layoutlab {' '.join(path)} --help'" in line, line


@pytest.mark.parametrize(
    "flag, value",
    [
        ("--time-budget", "0"),
        ("--time-budget", "nan"),
        ("--target", "1.5"),
        ("--warmup", "-1"),
        ("--max-step-seconds", "-2"),
    ],
)
def test_bench_numeric_flags_are_checked_under_their_own_names(flag, value, capsys):
    # The sweep's own validation would name the Python field (time_budget_s); a CLI user
    # typed the flag, so the line names the flag and the value it got.
    argv = ["bench", "--model", "small_cnn", "--out", "unused", flag, value]
    line = _one_line_error(argv, capsys)
    assert f"argument {flag}: expected" in line and repr(value) in line, line


def test_a_reader_that_goes_away_ends_the_command_quietly():
    # `layoutlab ... | head`: the pipe is closed before the command writes, so its output
    # meets a closed pipe. No traceback and no "Exception ignored" from the interpreter's
    # last flush, exit status 1 (Python's own for a broken pipe).
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "layoutlab.cli", "data", "--data", "digits"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write)
    assert (proc.returncode, proc.stderr) == (1, ""), proc.stderr
