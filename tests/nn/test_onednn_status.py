"""Whether oneDNN's convs run is said once, in ``layoutlab --version`` and bench's
``machine.json``, and never as a traceback: a loader that fails (no extension built, another
CPU architecture, a broken wheel) is simulated by monkeypatching it."""

import types

import pytest

from layoutlab import cli
from layoutlab.bench import machine
from layoutlab.nn.conv_algos import onednn_status


def _failing(monkeypatch):
    def load():
        raise OSError("simulated: libdnnl.so.3: cannot open shared object file\nsecond line")

    monkeypatch.setattr(onednn_status, "_load", load)


def _loaded(monkeypatch, available: bool):
    module = types.SimpleNamespace(
        available=lambda: available,
        unavailable_reason=lambda: None if available else "no AVX2 on this CPU",
        status_line=lambda: (
            "onednn convs: oneDNN 3.2.0"
            if available
            else "onednn convs: unavailable (no AVX2 on this CPU); XLA's convs run"
        ),
        wait_policy=lambda: "PASSIVE (set by layoutlab)",
    )
    monkeypatch.setattr(onednn_status, "_load", lambda: module)


def test_version_says_unavailable_in_one_line_when_the_loader_fails(monkeypatch, capsys):
    _failing(monkeypatch)
    with pytest.raises(SystemExit) as stop:
        cli.main(["--version"])
    out, err = capsys.readouterr()
    assert stop.value.code == 0 and err == "", err
    lines = out.strip().splitlines()
    assert lines[0].startswith("layoutlab ") and len(lines) == 2, out
    assert lines[1] == (
        "onednn convs: unavailable (OSError: simulated: libdnnl.so.3: cannot open shared "
        "object file); XLA's convs run"
    )


def test_version_prints_the_modules_own_line(monkeypatch, capsys):
    _loaded(monkeypatch, True)
    with pytest.raises(SystemExit):
        cli.main(["--version"])
    assert capsys.readouterr().out.strip().splitlines()[1] == "onednn convs: oneDNN 3.2.0"


@pytest.mark.parametrize("state", ["failing", "available", "unavailable"])
def test_machine_json_records_available_version_and_reason(monkeypatch, state):
    if state == "failing":
        _failing(monkeypatch)
    else:
        _loaded(monkeypatch, state == "available")
    record = machine.machine_info()["onednn"]
    assert set(record) == {"available", "version", "reason", "line", "wait_policy"}
    assert record["available"] == (state == "available")
    assert record["version"] == ("3.2.0" if state == "available" else None)
    # The policy oneDNN's threads run under is the loaded module's answer, only where it loaded.
    assert record["wait_policy"] == ("PASSIVE (set by layoutlab)" if state == "available" else None)
    if state == "available":
        assert record["reason"] is None
    else:
        assert record["reason"] in record["line"] and "unavailable" in record["line"]
