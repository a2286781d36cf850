"""The fine-tuning guide's example runs as written (docs/guides/fine-tuning.md): its
``layoutlab`` commands, through ``cli.main``, on a torchvision-definition ResNet-18 state
dict made here from a seed (1000 ImageNet classes; the repository's torch mirror, so neither
torchvision nor a download) and a folder of 36 tiny PNGs in three classes: trained with a new
head and a validation split, then evaluated from the best checkpoint."""

import re
import shlex
from pathlib import Path

import numpy as np
import pytest

from layoutlab import cli

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "fine-tuning.md"

pytestmark = pytest.mark.torch


def _commands() -> list[list[str]]:
    block = re.search(r"^```bash\n(.*?)^```", GUIDE.read_text(), re.S | re.M).group(1)
    out = []
    for line in block.replace("\\\n", " ").splitlines():
        words = shlex.split(line)
        if words and words[0] == "layoutlab":
            out.append(words[1:])
    return out


def test_the_fine_tuning_example_runs(tmp_path, monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    from PIL import Image

    from layoutlab.compare.torch_mirrors import build_torch_mirror

    torch.manual_seed(0)
    torch.save(build_torch_mirror("resnet18", num_classes=1000).state_dict(),
               tmp_path / "resnet18.pth")  # fmt: skip
    rng = np.random.default_rng(0)
    for c, name in enumerate(["daisy", "rose", "tulip"]):
        (tmp_path / "flowers" / name).mkdir(parents=True)
        for i in range(12):
            pixels = rng.integers(0, 256, (32, 32, 3)) // 3 + 80 * c
            Image.fromarray(pixels.astype(np.uint8)).save(tmp_path / "flowers" / name / f"{i}.png")
    monkeypatch.chdir(tmp_path)
    train, evaluate = _commands()
    assert train[0] == "train" and "--init" in train and evaluate[0] == "evaluate"
    # Compiled as the loop compiles init (test_train_loop's FAST_COMPILE): a third less CPU
    # time, the same program; the example's own flags are untouched.
    assert cli.main([*train, "--xla-option", "xla_backend_optimization_level=0"]) == 0
    err = capsys.readouterr().err
    note = "note: classifier head fc re-initialized for the data's classes (1000 -> 3 classes"
    assert note in err and note in GUIDE.read_text(), err
    assert (tmp_path / "runs" / "flowers" / "best").is_dir()  # --keep-best's checkpoint
    assert evaluate[-2:] == ["--checkpoint", "best"]
    assert cli.main(evaluate) == 0
    assert "accuracy" in capsys.readouterr().out
