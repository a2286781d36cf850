"""Running ``layoutlab`` in-process and reading its one-line errors, for the CLI tests."""

from layoutlab import cli

__all__ = ["one_line_error", "run_cli"]


def run_cli(capsys, *argv):
    """``(exit code, stdout, stderr)`` of ``layoutlab ARGV``, in this process."""
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(err: str, *fragments: str) -> str:
    """The one ``error:`` line ``err`` holds (and nothing else), containing ``fragments``."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]
