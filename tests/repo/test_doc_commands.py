"""Every ```bash block of the README and the documentation pages runs as written, or says
above it why it does not.

A block that does not run has a comment on the line above its fence, invisible on the page:
``% not run in tests: <reason>`` (MyST, in ``docs/``) or ``<!-- not run in tests: <reason> -->``
(the README, rendered by GitHub). There is no other skip: a block without the comment runs.

The blocks that run are ``layoutlab`` commands over a trained run: each line runs through
``cli.main`` in this process (the command line's own parser and code; only the console-script
shim is left out), in an empty directory holding ``runs/digits`` (a copy of the shared
4-step ``guarantees_run``) and ``pictures/`` (three 64x64 PNGs of digits), and must exit 0.
The commands of the blocks that do not run must still parse, options in ``[...]`` left out:
a renamed or misspelt flag fails here either way.
"""

import re
import shlex
import shutil

import numpy as np
import pytest
from test_readme import PAGES, ROOT

from layoutlab import cli
from layoutlab.bench.tuning.command import legacy_argv

_FENCE = re.compile(r"^```(?:bash|sh|shell|console)[^\n]*\n(.*?)^```", re.S | re.M)
_MARK = re.compile(r"^(?:%|<!--)\s*not run in tests:\s*(.*?)\s*(?:-->)?\s*$")


def _blocks() -> list[tuple[str, str, str | None]]:
    """``(name, code, reason)`` of every shell block; ``reason`` None: the block runs."""
    out = []
    for page in PAGES:
        text = page.read_text()
        stem = page.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".")
        for m in _FENCE.finditer(text):
            above = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            mark = _MARK.match(above.strip())
            line = text.count("\n", 0, m.start()) + 1
            out.append((f"{stem}:L{line}", m.group(1), mark.group(1) if mark else None))
    return out


BLOCKS = _blocks()
RUN = [(name, code) for name, code, reason in BLOCKS if reason is None]
NOT_RUN = [(name, code, reason) for name, code, reason in BLOCKS if reason is not None]


def _commands(code: str) -> list[list[str]]:
    """The ``layoutlab`` command lines of a block, as argv after ``layoutlab`` (continuation
    lines joined, comments dropped, anything before ``layoutlab`` — an environment variable,
    ``srun ...`` — left out)."""
    out = []
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if "layoutlab" in words:
            out.append(words[words.index("layoutlab") + 1 :])
    return out


def test_every_shell_block_runs_or_says_why():
    assert BLOCKS, "no shell blocks found"
    for name, _, reason in NOT_RUN:
        assert len(reason) > 10, f"{name}: say why the block does not run"
    # The comment is for what cannot run here (downloads, installs, long benchmarks, other
    # machines); the commands over a trained run do.
    assert len(RUN) >= 4, [name for name, _ in RUN]


@pytest.mark.parametrize("code", [c for _, c in RUN], ids=[n for n, _ in RUN])
def test_shell_block_runs(code, guarantees_run, tmp_path, monkeypatch, capsys):
    from PIL import Image
    from sklearn.datasets import load_digits

    shutil.copytree(guarantees_run, tmp_path / "runs" / "digits")
    (tmp_path / "pictures").mkdir()
    for i, digit in enumerate(load_digits().images[:3]):
        pixels = np.kron(digit * (255 / 16), np.ones((8, 8))).astype(np.uint8)
        Image.fromarray(pixels).save(tmp_path / "pictures" / f"{i}.png")
    monkeypatch.chdir(tmp_path)
    commands = _commands(code)
    assert commands and len(commands) == len(code.replace("\\\n", " ").strip().splitlines()), (
        f"every line of a block that runs is a layoutlab command; else mark it:\n{code}"
    )
    for argv in commands:
        try:
            code_ = cli.main(argv)
        except SystemExit as stop:  # --version and --help exit from argparse
            code_ = stop.code
        out, err = capsys.readouterr()
        assert code_ == 0, f"layoutlab {shlex.join(argv)} exited {code_}:\n{err[-3000:]}"
        assert out.strip(), f"layoutlab {shlex.join(argv)} printed nothing"


@pytest.mark.parametrize("code", [c for _, c, _ in NOT_RUN], ids=[n for n, _, _ in NOT_RUN])
def test_commands_of_blocks_not_run_parse(code, capsys):
    parser = cli.build_parser()
    for argv in _commands(re.sub(r"\[[^\]]*\]", "", code)):
        try:
            parser.parse_args(legacy_argv(argv))
        except SystemExit as stop:
            assert stop.code == 0, f"layoutlab {shlex.join(argv)}: {capsys.readouterr().err}"
        assert "warning:" not in capsys.readouterr().err, shlex.join(argv)
