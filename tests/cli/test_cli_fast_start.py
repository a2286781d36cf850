"""``layoutlab --help``, every command's ``--help`` and ``layoutlab models`` import no JAX.

They run one after another in one fresh interpreter, which reports after each the heavy
packages imported so far: an import is not undone, so the first command that pulls one in is
the one named, as it would be in an interpreter of its own (one process instead of one per
command: about 40 interpreter starts and ``layoutlab.cli`` imports fewer). The assertion is
on modules, not on seconds (the machines are shared and noisy). The static tables the
parsers read instead of the real registries are checked against them here.
"""

import argparse
import importlib.metadata
import json
import subprocess
import sys
import time

import pytest

from layoutlab import cli, models
from layoutlab.models.catalog import BUILTIN_MODELS
from layoutlab.nn.conv_algos import algorithm_names, builtin
from layoutlab.nn.conv_names import BUILTIN_ALGORITHMS

HEAVY = ("jax", "jaxlib", "flax", "optax", "orbax", "torch", "matplotlib", "tensorboardX")

PROBE = """
import contextlib, io, json, sys, time
results = []
for argv in json.loads(sys.argv[1]):
    start = time.perf_counter()
    from layoutlab import cli
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            code = cli.main(argv)
        except SystemExit as e:
            code = e.code
    seconds = time.perf_counter() - start
    heavy = sorted({m.split(".")[0] for m in sys.modules} & set(json.loads(sys.argv[2])))
    results.append({"code": code, "heavy": heavy, "seconds": seconds})
print("\\n" + json.dumps(results))
"""


def _command_paths(parser=None, prefix=()):
    """Every command and nested subcommand of the ``layoutlab`` parser."""
    parser = parser or cli.build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*prefix, name)
                yield from _command_paths(sub, (*prefix, name))


def _probe(runs):
    """``{"code", "heavy", "seconds"}`` of each argv of ``runs``, run in this order in one
    fresh interpreter; ``heavy``: the heavy packages imported by then."""
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(runs), json.dumps(HEAVY)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_help_and_models_import_no_jax():
    paths = sorted(set(_command_paths()))
    assert ("train",) in paths and ("autotune", "convs") in paths
    runs = [["--help"], ["--version"], ["models"], ["models", "--json"]]
    runs += [[*p, "--help"] for p in paths]
    results = _probe(runs)
    assert len(results) == len(runs)
    for argv, result in zip(runs, results, strict=True):
        assert result["code"] == 0, argv
        assert result["heavy"] == [], (argv, result["heavy"])
    # The first command pays the import of layoutlab.cli, as each did in a process of its own.
    print(
        f"first command in-process: {results[0]['seconds']:.3f}s; slowest of the others: "
        f"{max(r['seconds'] for r in results[1:]):.3f}s ({len(runs)} commands)"
    )


def test_layoutlab_help_wall_time_is_reported():
    # Informational: the wall time of the installed console script, process start included.
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "layoutlab.cli", "--help"], capture_output=True, timeout=60
    )
    assert proc.returncode == 0
    print(f"layoutlab --help: {time.perf_counter() - start:.3f}s wall")


def test_version_is_the_installed_distributions(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.split() == ["layoutlab", importlib.metadata.version("layoutlab")]


def test_the_static_tables_match_the_registries():
    assert BUILTIN_ALGORITHMS == algorithm_names()[: len(BUILTIN_ALGORITHMS)]
    assert BUILTIN_ALGORITHMS == tuple(a.name for a in builtin.BUILTIN)  # every one, in order
    listed = {e.name: e for e in BUILTIN_MODELS}
    assert sorted(listed) == models.names()
    for name in models.names():
        spec = models.spec(name)
        entry = listed[name]
        assert (entry.task, entry.num_spatial, entry.default_input, entry.description) == (
            spec.task,
            spec.num_spatial,
            tuple(spec.default_input),
            spec.description,
        ), name


@pytest.mark.parametrize("argv", [["models"], ["models", "--json"]])
def test_models_lists_every_registered_model(argv, capsys):
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    names = [r["name"] for r in json.loads(out)] if "--json" in argv else out.split()
    for name in models.names():
        assert name in names
