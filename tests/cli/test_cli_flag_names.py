"""One name per concept across every command's parser, and one meaning per name.

The table says which flag spells each concept and which commands take it; the retired
spellings may only survive hidden from ``--help`` (they warn, see test_cli_vocabulary).
"""

import argparse

import pytest
from test_cli_fast_start import _command_paths

from layoutlab import cli
from layoutlab.arguments import STDOUT, parse_image_size

# concept: (the flag, the commands that must take it)
CONCEPTS = {
    "registered model": ("--model", ["inspect", "compare", "bench", "autotune layout", "train"]),
    "data source": ("--data", ["train", "evaluate", "data"]),
    "batch size": (
        "--batch-size",
        ["train", "inspect", "compare", "export", "evaluate", "predict", "autotune convs"],
    ),
    "JSON on standard output": (
        "--json",
        ["models", "data", "evaluate", "predict", "inspect", "compare", "autotune convs"],
    ),
    "JSON written to a file": ("--json-file", ["evaluate", "inspect", "compare"]),
    "ResNet stem": ("--stem", ["train", "inspect", "bench", "autotune layout", "autotune convs"]),
    "the model's tiny variant": (
        "--tiny",
        ["train", "inspect", "compare", "bench", "autotune layout", "autotune convs"],
    ),
    "model keyword argument": ("--model-arg", ["train", "inspect", "compare", "bench"]),
    "XLA compile option": ("--xla-option", ["train", "inspect", "bench", "autotune convs"]),
    "forward only or a training step": ("--mode", ["inspect", "compare", "autotune convs"]),
    "autotune cache file": ("--cache", ["autotune layout", "autotune convs"]),
    "input image size": (
        "--image-size",
        ["train", "data", "inspect", "compare", "bench", "autotune layout", "autotune convs"],
    ),
}
# Old spellings of a concept above: hidden if present at all.
RETIRED = {
    "--spec": "--data",
    "--batch": "--batch-size",
    "--objective": "--mode",
    "--input-shape": "--image-size",
}


def _parsers():
    parser = cli.build_parser()
    out = {}
    for path in sorted(set(_command_paths(parser))):
        sub = parser
        for name in path:
            action = next(a for a in sub._actions if isinstance(a, argparse._SubParsersAction))
            sub = action.choices[name]
        out[" ".join(path)] = sub
    return out


PARSERS = _parsers()


def _options(parser, visible=True):
    return {
        s: a
        for a in parser._actions
        for s in a.option_strings
        if not visible or a.help != argparse.SUPPRESS
    }


@pytest.mark.parametrize("concept", CONCEPTS)
def test_each_concept_has_one_flag_in_every_command(concept):
    flag, commands = CONCEPTS[concept]
    for command in commands:
        assert flag in _options(PARSERS[command]), (concept, command)


def test_retired_spellings_are_hidden_everywhere():
    for command, parser in PARSERS.items():
        for old in RETIRED:
            assert old not in _options(parser), (command, old)


def test_json_means_standard_output_everywhere():
    for command, parser in PARSERS.items():
        options = _options(parser)
        if "--json" in options:
            action = options["--json"]
            assert action.nargs in (0, "?"), command  # never needs a value
            # What argparse does with a bare --json (the commands' required flags aside)
            args = argparse.Namespace()
            action(parser, args, [] if action.nargs == 0 else None, "--json")
            assert args.json == STDOUT, command
        if "--json-file" in options:
            action = options["--json-file"]
            assert action.dest == "json" and action.nargs is None, command


def test_retired_spellings_still_parse_with_a_warning(capsys):
    data = PARSERS["data"].parse_args(["--spec", "digits"])
    export = PARSERS["export"].parse_args(["--workdir", "w", "--out", "m", "--batch", "4"])
    inspect = PARSERS["inspect"].parse_args(["--model", "small_cnn", "--json", "r.json"])
    tune = ["--model", "small_cnn", "--batch-size", "2", "--input-shape", "8x6x1"]
    layout = PARSERS["autotune layout"].parse_args(tune)
    assert (data.data, export.batch, inspect.json) == ("digits", "4", "r.json")
    assert layout.input_shape == "8x6x1"
    warnings = capsys.readouterr().err.splitlines()
    assert len(warnings) == 4 and all(w.startswith("warning: ") for w in warnings), warnings


def test_image_size_is_one_parser_everywhere():
    """N, HxW and H,W in every command that takes --image-size; bad sizes are the same
    argparse error (one line through OneLineParser, see test_cli_errors)."""
    assert parse_image_size("64") == (64,)
    assert parse_image_size("64x48") == parse_image_size("64,48") == (64, 48)
    takers = {c for c, p in PARSERS.items() if "--image-size" in _options(p)}
    assert takers - {"conv-autotune"} == set(CONCEPTS["input image size"][1])  # its old name
    for command in sorted(takers):
        parse = _options(PARSERS[command])["--image-size"].type
        assert parse("64x48") == parse("64,48") != parse("64"), command
        for bad in ("0", "64x", "64x48x3", "a"):
            with pytest.raises(argparse.ArgumentTypeError, match="expected N, HxW or H,W"):
                parse(bad)


def test_autotune_image_size_and_channels_replace_input_shape(capsys):
    from layoutlab.bench.tuning.command import autotune_input_shape

    def shape(*argv):
        argv = ["--model", "small_cnn", "--batch-size", "2", *argv]
        return autotune_input_shape(PARSERS["autotune layout"].parse_args(argv))

    assert shape("--image-size", "8x6", "--channels", "1") == (8, 6, 1)
    assert shape("--image-size", "8") == (8, 8, 1)  # the model's channels
    assert shape() == (8, 8, 1)  # the model's default input
    assert shape("--input-shape", "8x6x1") == "8x6x1"  # as given, with a warning
    with pytest.raises(ValueError, match="old spelling of --image-size with --channels"):
        shape("--input-shape", "8x6x1", "--image-size", "8")


def test_a_runs_flags_are_declared_in_one_place(monkeypatch):
    """``--precision`` (and every other flag of what a run is) is declared by one line of
    ``train.run_flags.add_run_flags`` in every command that takes it: the full parser is
    built with ``add_argument`` watched, and each declaration's caller is counted (issue 68:
    ``--precision`` was declared five times, with different defaults)."""
    import inspect

    from layoutlab.train import run_flags

    calls = {}
    add_argument = argparse._ActionsContainer.add_argument

    def watched(self, *names, **kwargs):
        caller = inspect.stack(context=0)[1]
        for name in names:
            calls.setdefault(name, []).append((caller.filename, caller.lineno))
        return add_argument(self, *names, **kwargs)

    monkeypatch.setattr(argparse._ActionsContainer, "add_argument", watched)
    cli.build_parser()
    # (--batch-size is a run flag too, but evaluate's and export's batch is the program's
    # they read back or write, not a run's.)
    run = ["--precision", "--model", "--layout", "--conv-algo", "--xla-option", "--stem"]
    run += ["--kernel-storage", "--activation-storage", "--cpu-fast", "--tiny", "--model-arg"]
    run += ["--precisions", "--layouts", "--batch-sizes", "--conv-algos"]
    for flag in run:
        places = set(calls[flag])
        assert len(places) == 1, (flag, sorted(places))
        assert places.pop()[0] == run_flags.__file__, flag
    # train, inspect, compare, autotune convs and its old name conv-autotune; bench's list
    assert (len(calls["--precision"]), len(calls["--precisions"])) == (5, 1)


# The text a user writes for each idea, by its metavar (issue 68: all three were "SPEC").
USER_TEXT = {
    "--data": "SOURCE",
    "--precision": "POLICY",
    "--precisions": "POLICY,POLICY",
    "--loss-scale": "SCALE",
}


def test_user_text_is_named_for_its_idea_and_never_spec():
    """Every command's flag for a data source, policy name or loss-scale name shows it by that
    metavar in --help, and no metavar, help line or description anywhere says "spec" (the
    word names the resolved Spec types alone, see docs/glossary.md)."""
    import re

    seen = {flag: [] for flag in USER_TEXT}
    for command, parser in PARSERS.items():
        texts = [parser.description or ""]
        for flag, action in _options(parser).items():
            if flag in USER_TEXT:
                assert action.metavar == USER_TEXT[flag], (command, flag, action.metavar)
                seen[flag].append(command)
            texts += [str(action.metavar or ""), action.help or ""]
        spec = [t for t in texts if re.search(r"\bspecs?\b", t, re.I)]
        assert not spec, (command, spec)
        help_text = parser.format_help()
        assert "SPEC" not in help_text, command
    inspect_like = ["autotune convs", "compare", "conv-autotune", "inspect", "train"]
    assert sorted(seen["--precision"]) == inspect_like
    assert (seen["--precisions"], seen["--loss-scale"]) == (["bench"], ["train"])
    assert sorted(seen["--data"]) == ["data", "evaluate", "train"]
