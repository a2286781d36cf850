"""Every ``layoutlab`` command says what it does and every flag what it means: a walk over
the whole parser (``cli.build_parser``), so a command or flag added without help fails here."""

import argparse

from layoutlab import cli


def _walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = (), listed: str | None = None):
    """``(command path, parser, its line in its parent's list)`` of ``parser`` and of every
    subcommand under it."""
    yield path, parser, listed
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            lines = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield from _walk(sub, (*path, name), lines.get(name))


COMMANDS = list(_walk(cli.build_parser()))
# Deprecated aliases kept out of the command list on purpose (they still have a description).
UNLISTED = {("conv-autotune",)}


def _flags(parser):
    return [a for a in parser._actions if a.option_strings and a.help != argparse.SUPPRESS]


def test_every_command_has_a_description_and_a_line_in_its_parents_list():
    missing = []
    for path, parser, listed in COMMANDS:
        if not (parser.description or "").strip():
            missing.append(f"layoutlab {' '.join(path)}: no description")
        if path and path not in UNLISTED and not (listed or "").strip():
            missing.append(f"layoutlab {' '.join(path)}: no help line in its parent's list")
    assert len(COMMANDS) > 10 and missing == []


def test_every_flag_has_help():
    missing = [
        f"layoutlab {' '.join(path)} {'/'.join(a.option_strings)}"
        for path, parser, _ in COMMANDS
        for a in _flags(parser)
        if not (a.help or "").strip()
    ]
    assert missing == []


def test_no_flag_with_an_optional_value_reads_as_if_it_wants_its_own_name():
    # argparse shows an optional value as `--json [JSON]`: a flag that seems to take JSON.
    # One whose value may be left out names what that value is (`--json [FILE]`, the old
    # spelling of --json-file FILE) with a metavar of its own.
    unclear = [
        f"layoutlab {' '.join(path)} {'/'.join(a.option_strings)}"
        for path, parser, _ in COMMANDS
        for a in _flags(parser)
        if a.nargs == argparse.OPTIONAL and a.metavar in (None, a.dest.upper())
    ]
    assert unclear == []
    evaluate = next(p for path, p, _ in COMMANDS if path == ("evaluate",))
    assert "--json [FILE]" in evaluate.format_help() and "[JSON]" not in evaluate.format_help()
