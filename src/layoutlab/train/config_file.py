"""``train --config FILE``: a ``TrainConfig`` written as a JSON or YAML mapping of its fields.

The file holds any subset of the fields (``config.json`` of an earlier run is one such
file); the rest keep their defaults. Flags and ``--set`` apply on top of it. YAML is read
with PyYAML's ``safe_load``, so a file cannot construct Python objects.
"""

from __future__ import annotations

import json
from pathlib import Path

from layoutlab.train.config import TrainConfig

__all__ = ["read_config_file", "CONFIG_SUFFIXES"]

CONFIG_SUFFIXES = (".json", ".yaml", ".yml")


def _parse(path: Path, text: str):
    if path.suffix.lower() == ".json":
        return json.loads(text)
    import yaml

    return yaml.safe_load(text)


def read_config_file(path: str | Path, base: TrainConfig | None = None) -> TrainConfig:
    """``base`` (default: ``TrainConfig()``) with the fields that ``path`` sets.

    Raises ``ValueError`` naming the file for a missing or unreadable file, a suffix other
    than ``.json``/``.yaml``/``.yml``, text that does not parse, a top level that is not a
    mapping, and unknown fields or values of the wrong type.
    """
    path = Path(path).expanduser()
    if path.suffix.lower() not in CONFIG_SUFFIXES:
        raise ValueError(
            f"--config {path}: use a .json, .yaml or .yml file (a mapping of TrainConfig fields)."
        )
    try:
        text = path.read_text()
    except OSError as e:
        raise ValueError(
            f"--config {path} cannot be read ({e.strerror}); check the path."
        ) from None
    try:
        fields = _parse(path, text)
    except Exception as e:  # json.JSONDecodeError, yaml.YAMLError: both name the line
        detail = " ".join(str(e).split())
        raise ValueError(f"--config {path} does not parse ({detail}); fix the file.") from None
    if fields is None:
        fields = {}
    if not isinstance(fields, dict):
        raise ValueError(
            f"--config {path} holds a {type(fields).__name__}, not a mapping of TrainConfig "
            "fields; write e.g. 'model: small_cnn' on its own line."
        )
    base = base if base is not None else TrainConfig()
    try:
        return TrainConfig.from_dict({**base.to_dict(), **fields})
    except ValueError as e:
        raise ValueError(f"--config {path}: {e}") from None
