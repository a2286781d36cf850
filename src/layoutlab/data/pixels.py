"""Image files to pixel arrays, for folder data sets and ``predict`` alike.

Pillow opens a 16-bit grayscale PNG in mode ``I;16``, and ``convert("L")`` clips it at 255
(a 16-bit photograph turns almost all white). So images are read by depth:

- 8-bit images (``L``, ``RGB``, palette, 1-bit, with or without alpha: alpha is dropped)
  give ``uint8`` pixels in ``0..255``;
- 16-bit grayscale (``I;16``, ``I;16B``, ``I;16L``, ``I;16N``, and ``I`` whose values fit in
  16 bits) gives pixels in ``0..65535``; a data set holding any of them is read in those
  units throughout (an 8-bit pixel ``v`` becomes ``257 v``, which is ``v / 255`` of 65535
  exactly), as ``float32`` resized in Pillow's float mode;
- anything else (floating-point ``F``, ``I`` beyond 16 bits) is refused with one line naming
  the file and mode: its range is not known, and guessing would change the images.

Pillow itself reads a 48-bit RGB PNG as 8-bit ``RGB`` (the high byte of each sample): scaled,
not clipped.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from layoutlab.data.errors import DataError

__all__ = ["DEEP_MAX", "GRAY_MODES", "SIXTEEN_BIT_MODES", "check_mode", "read_pixels"]

SIXTEEN_BIT_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I")
GRAY_MODES = ("1", "L", "LA", "La", *SIXTEEN_BIT_MODES)
DEEP_MAX = 65535.0  # the largest 16-bit pixel
_EIGHT_TO_SIXTEEN = 257  # 255 * 257 == 65535
_REFUSED = {"F": "floating-point pixels, whose range is not known"}
_FIX = "save it as an 8- or 16-bit PNG"


def check_mode(path: Path, mode: str) -> None:
    """Refuses (``DataError``, one line naming the file and mode) the modes read would guess."""
    if mode in _REFUSED:
        raise DataError(f"{path} has Pillow mode {mode} ({_REFUSED[mode]}); {_FIX}.")


def _sixteen_bit(path: Path, image) -> np.ndarray:
    """``(H, W)`` float32 in ``0..65535`` of a 16-bit grayscale image."""
    values = np.asarray(image)
    if values.size and (values.min() < 0 or values.max() > DEEP_MAX):
        raise DataError(
            f"{path} has Pillow mode {image.mode} with values in [{values.min()}, "
            f"{values.max()}], beyond 16 bits; {_FIX}."
        )
    return values.astype(np.float32)


def _resize_float(pixels: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    from PIL import Image

    target, bilinear = (size[1], size[0]), Image.Resampling.BILINEAR
    channels = [
        np.asarray(
            Image.fromarray(np.ascontiguousarray(pixels[..., c]), "F").resize(target, bilinear)
        )
        for c in range(pixels.shape[-1])
    ]
    return np.stack(channels, axis=-1)


def read_pixels(path: Path, gray: bool, size: tuple[int, int], deep: bool) -> np.ndarray:
    """``(H, W, C)`` pixels of the image file ``path`` at ``size`` (``(H, W)``, bilinear),
    with 1 channel when ``gray`` else 3: ``uint8`` in ``0..255`` unless ``deep``, then
    ``float32`` in ``0..65535``. A 16-bit image read without ``deep`` (``predict`` for a run
    of 8-bit images) gives ``float32`` in ``0..255``, scaled rather than clipped."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            check_mode(path, image.mode)
            if image.mode in SIXTEEN_BIT_MODES:
                pixels = _sixteen_bit(path, image)[..., None]
                pixels = pixels if gray else np.repeat(pixels, 3, axis=-1)
            else:
                converted = image.convert("L" if gray else "RGB")  # decodes the pixels
    except DataError:
        raise
    except Exception as e:  # Pillow raises several types for unreadable or truncated files
        raise DataError(
            f"Cannot read image {path} ({type(e).__name__}: {e}); pass a PNG, JPEG, BMP or "
            "GIF file."
        ) from None
    if image.mode not in SIXTEEN_BIT_MODES:
        if not deep:  # 8-bit images of an 8-bit data set: resized in their own mode
            if converted.size != (size[1], size[0]):
                converted = converted.resize((size[1], size[0]), Image.Resampling.BILINEAR)
            pixels = np.asarray(converted, np.uint8)
            return pixels[..., None] if pixels.ndim == 2 else pixels
        pixels = np.asarray(converted, np.float32) * np.float32(_EIGHT_TO_SIXTEEN)
        pixels = pixels[..., None] if pixels.ndim == 2 else pixels
    if pixels.shape[:2] != size:
        pixels = _resize_float(pixels, size)
    if not deep:
        pixels = pixels * np.float32(255.0 / DEEP_MAX)
    return pixels
