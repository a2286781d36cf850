"""Every ```python block of the README and of the documentation pages (``docs/``) runs as
written, each in a process of its own.

A process per block is what a reader gets who pastes one block into a new session: no names
leak from earlier blocks, and ``keep_host_memory()`` really comes before JAX's backend
starts. Each process is forked from one that has only imported the libraries
(``block_server``), which saves about 3 s of imports per block; the block itself runs as
``python -c`` would run it. Each block runs in its own empty working directory, so the files
a snippet writes (runs, reports, weights) never land in the checkout. A block that is
illustrative only would be fenced ```` ```text ````; there is no skip list.
"""

import os
import re
from pathlib import Path

import pytest
from block_server import PRELOAD, BlockServer

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# The hand-written pages: docs/_generated/ and docs/_build/ are the build's.
PAGES = [
    README,
    *sorted(
        p for p in (ROOT / "docs").rglob("*.md") if not any(x.startswith("_") for x in p.parts)
    ),
]
_FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```", re.S | re.M)
# Generous: the slowest blocks compile a few small training steps on a loaded 2-core machine.
_TIMEOUT_S = 420


def _blocks() -> list[tuple[str, str]]:
    out, seen = [], set()
    for page in PAGES:
        for name, code in _page_blocks(page):
            if code not in seen:  # the README's quickstart repeats the docs' one
                seen.add(code)
                out.append((name, code))
    return out


def _page_blocks(page: Path) -> list[tuple[str, str]]:
    text = page.read_text()
    stem = page.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".")
    out = []
    for m in _FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        heading = ""
        # Headings outside code blocks only: a "# comment" inside one is not a heading.
        for h in re.finditer(
            r"^#+ (.+)$", re.sub(r"^```.*?^```", "", text[: m.start()], flags=re.S | re.M), re.M
        ):
            heading = h.group(1)
        slug = re.sub(r"[^a-z0-9]+", "-", heading.lower()).strip("-")
        out.append((f"{stem}:L{line}-{slug}", m.group(1)))
    return out


BLOCKS = _blocks()


def test_readme_has_python_blocks():
    assert len(BLOCKS) >= 10, [name for name, _ in BLOCKS]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The process the blocks are forked from. One persistent compilation cache for every
    block: blocks that build or train the same model (the README's quickstart and the
    using-a-run guide train the same run) read the programs back instead of compiling them
    again. The same executables, the same numbers."""
    env = dict(os.environ)
    # The reader's environment, not the suite's: no fake devices or strict promotion flags.
    env.pop("XLA_FLAGS", None)
    env["MPLBACKEND"] = "Agg"
    # JAX_COMPILATION_CACHE_DIR stays the suite's (tests/conftest.py), shared with the modules
    # that run the same commands.
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    # Besides the server's usual libraries, PyTorch: the blocks that compare against it,
    # convert its weights or benchmark beside it import it again each (1.5 s of CPU).
    srv = BlockServer(env, tmp_path_factory.mktemp("block_server"), (*PRELOAD, "torch"))
    yield srv
    srv.close()


@pytest.mark.parametrize("code", [c for _, c in BLOCKS], ids=[n for n, _ in BLOCKS])
def test_readme_block_runs(code, tmp_path, server):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    rc, _, stderr = server.run(code, cwd, _TIMEOUT_S)
    assert rc == 0, f"block failed:\n{code}\n--- stderr ---\n{stderr[-4000:]}"


def test_a_block_runs_as_python_c_would(tmp_path, server):
    """What the blocks rely on: a fresh ``__main__``, ``-c``'s argv and path, the working
    directory given, JAX's backend not yet started, exit codes and tracebacks as the
    interpreter gives them, and atexit handlers run."""
    probe = (
        "import atexit, os, sys\n"
        "from layoutlab.host.memory import backend_started\n"
        "assert 'server' not in dir() and 'BlockServer' not in dir(), dir()\n"
        "assert sys.argv == ['-c'] and sys.path[0] == '', (sys.argv, sys.path[0])\n"
        "assert not backend_started()\n"
        "print(os.getcwd(), __name__)\n"
        "atexit.register(lambda: print('at exit'))\n"
    )
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    rc, out, err = server.run(probe, cwd, 60)
    assert (rc, out.split()) == (0, [str(cwd), "__main__", "at", "exit"]), err
    rc, _, err = server.run("import sys; sys.exit(3)", cwd, 60)
    assert rc == 3
    rc, _, err = server.run("raise ValueError('no such thing')", cwd, 60)
    assert rc == 1 and "ValueError: no such thing" in err
    assert list(cwd.iterdir()) == []  # the output files live beside the directory, not in it


def test_readme_yaml_blocks_are_valid_train_config_files(tmp_path):
    """Each ```yaml block is a ``train --config`` file: it reads into a config that validates
    (the data set it names need not exist here; validation checks the data source's form)."""
    from layoutlab.train.config import validate
    from layoutlab.train.config_file import read_config_file

    text = "\n".join(page.read_text() for page in PAGES)
    blocks = re.findall(r"^```yaml\n(.*?)^```", text, re.S | re.M)
    assert blocks
    for i, text in enumerate(blocks):
        path = tmp_path / f"block{i}.yaml"
        path.write_text(text)
        validate(read_config_file(path), 1)
