"""Image preprocessing for classifiers and detectors: files → normalised float32 batches.

Used by real-model tests, benchmarks and the command line to turn JPEG/PNG
files into model inputs: resize the shorter side (bilinear), centre-crop (or
letterbox: fit inside a box keeping the aspect ratio, pad the rest, as YOLO does),
convert to RGB (or BGR), then ``(x / scale - mean) / std`` per channel (as the command line's
``--scale``), where
x is the 0..255 pixel value.  Pillow is imported only when an image is read.
"""

from __future__ import annotations

import numbers
import os
from typing import Sequence

import numpy as np

from ..core.errors import CalibrationDataError, PPQLikeError

#: File suffixes :func:`load_image_folder` reads (compared case-insensitively).
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")

#: YOLO's letterbox fill, in 0..255 pixel units (grey 114)
LETTERBOX_VALUE = 114.0


def _pillow():
    try:
        from PIL import Image
    except ImportError:
        raise PPQLikeError("reading images needs Pillow, which is not installed; run `pip install Pillow` "
                           "(or `pip install \".[images]\"` in a ppqlike checkout)") from None
    return Image


def require_pillow() -> None:
    """PPQLikeError with the install hint when Pillow is missing: called before any work starts."""
    _pillow()


def _per_channel(value, name: str) -> np.ndarray:
    array = np.asarray(value, dtype=np.float32).reshape(-1)
    if array.size not in (1, 3):
        raise PPQLikeError(f"image {name} must be one number or three (one per channel), got {value!r}")
    return array


class _Default(int):
    """A default size that a letterbox replaces (given explicitly, a size with a letterbox is an error)."""

    def __repr__(self) -> str:
        return f"{int(self)} (default)"


def load_image(path: str | os.PathLike, resize_shorter: int | None = _Default(256),
               crop: int | Sequence[int] | None = _Default(224),
               mean: float | Sequence[float] = 0.0, std: float | Sequence[float] = 1.0, scale: float = 1.0,
               bgr: bool = False, layout: str = "NCHW", letterbox: int | Sequence[int] | None = None,
               letterbox_value: float | Sequence[float] = LETTERBOX_VALUE) -> np.ndarray:
    """Read one image file as a float32 batch of one: [1, 3, H, W] (NCHW) or [1, H, W, 3] (NHWC).

    ``resize_shorter``: the shorter side is resized to this many pixels with
    bilinear filtering (None: no resize).  ``crop``: centre crop of this size
    (an int for a square, or (height, width); None: no crop).  ``letterbox``
    (an int for a square, or (height, width)), instead of resize and crop (their
    defaults then do not apply; given explicitly they are an error): the
    image is scaled by min(height / h, width / w) (bilinear, keeping its aspect
    ratio; each side rounded) and centred on a canvas of that size filled with
    ``letterbox_value`` (0..255 pixel units, one value or three in the output
    channel order), as YOLO's preprocessing does: the top (left) pad is
    round(pad / 2 - 0.1), the rest goes below (right).  Greyscale,
    palette and RGBA images are converted to RGB (16-bit greyscale scaled to 0..255); ``bgr`` then reverses the
    channel order.  ``mean`` and ``std`` are given in the output channel order.
    """
    if layout not in ("NCHW", "NHWC"):
        raise PPQLikeError(f"image layout must be 'NCHW' or 'NHWC', not {layout!r}")
    if letterbox is not None:
        resize_shorter = None if isinstance(resize_shorter, _Default) else resize_shorter
        crop = None if isinstance(crop, _Default) else crop
    if letterbox is not None and (resize_shorter or crop):
        raise PPQLikeError(f"image {os.fspath(path)!r}: letterbox={letterbox!r} replaces resizing and cropping; "
                           f"leave resize_shorter ({resize_shorter!r}) and crop ({crop!r}) unset")
    box = None if letterbox is None else _size(letterbox, "letterbox")
    pad_value = _per_channel(letterbox_value, "letterbox value")
    mean_array, std_array = _per_channel(mean, "mean"), _per_channel(std, "std")
    if np.any(std_array == 0):
        raise PPQLikeError(f"image std must not be zero, got {std!r}")
    if not (isinstance(scale, (int, float, np.number)) and np.isfinite(scale) and scale > 0):
        raise PPQLikeError(f"image scale is a divisor (x / scale, e.g. 255) and must be > 0, got {scale!r}")
    image_module = _pillow()
    try:
        with image_module.open(os.fspath(path)) as image:
            image = _to_rgb(image_module, image, os.fspath(path))
            if resize_shorter:
                width, height = image.size
                if width <= height:
                    size = (resize_shorter, int(resize_shorter * height / width))
                else:
                    size = (int(resize_shorter * width / height), resize_shorter)
                image = image.resize(size, image_module.BILINEAR)
            if crop:
                crop_h, crop_w = (int(crop), int(crop)) if isinstance(crop, numbers.Integral) else map(int, crop)
                width, height = image.size
                if crop_h > height or crop_w > width:
                    raise PPQLikeError(f"image {os.fspath(path)!r} is {width}x{height} after resizing, "
                                       f"smaller than the {crop_w}x{crop_h} crop")
                top, left = int(round((height - crop_h) / 2.0)), int(round((width - crop_w) / 2.0))
                image = image.crop((left, top, left + crop_w, top + crop_h))
            if box is not None:
                image = _fit_inside(image_module, image, box)
            pixels = np.asarray(image, dtype=np.float32)
    except PPQLikeError:
        raise
    except (OSError, ValueError) as error:  # missing file, not an image, truncated image
        raise PPQLikeError(f"cannot read image {os.fspath(path)!r}: {error}") from None
    if bgr:
        pixels = pixels[..., ::-1]
    if box is not None:
        pixels = _pad_centred(pixels, box, pad_value)
    pixels = (pixels / np.float32(scale) - mean_array) / std_array
    if layout == "NCHW":
        pixels = pixels.transpose(2, 0, 1)
    return np.ascontiguousarray(pixels[None], dtype=np.float32)


def _size(value, name: str) -> tuple[int, int]:
    """(height, width) of an int (a square) or a pair; PPQLikeError otherwise."""
    sizes = (value, value) if isinstance(value, numbers.Integral) else tuple(value)
    if len(sizes) != 2 or not all(isinstance(v, numbers.Integral) and v > 0 for v in sizes):
        raise PPQLikeError(f"image {name} must be a positive size N or (height, width), got {value!r}")
    return int(sizes[0]), int(sizes[1])


def _fit_inside(image_module, image, box: tuple[int, int]):
    """``image`` scaled by min(box_h / h, box_w / w) (bilinear; sides rounded), its aspect ratio kept."""
    width, height = image.size
    ratio = min(box[0] / height, box[1] / width)
    size = (max(1, int(round(width * ratio))), max(1, int(round(height * ratio))))
    return image if size == (width, height) else image.resize(size, image_module.BILINEAR)


def _pad_centred(pixels: np.ndarray, box: tuple[int, int], value: np.ndarray) -> np.ndarray:
    """``pixels`` [h, w, 3] centred on a [box_h, box_w, 3] canvas of ``value``: top/left pad
    round(pad / 2 - 0.1), the rest at the bottom/right (YOLO's letterbox)."""
    height, width = pixels.shape[:2]
    top, left = int(round((box[0] - height) / 2 - 0.1)), int(round((box[1] - width) / 2 - 0.1))
    canvas = np.empty((box[0], box[1], pixels.shape[2]), dtype=np.float32)
    canvas[...] = value
    canvas[top:top + height, left:left + width] = pixels
    return canvas


#: Pillow modes of single-channel images with more than 8 bits per pixel
_WIDE_GREY_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I")


def _to_rgb(image_module, image, path: str):
    """The image in 8-bit RGB.  16-bit greyscale is scaled to 0..255 (x / 257: 65535 -> 255), so the
    usual ``scale``/``mean``/``std`` apply, instead of being clipped to 255 by Pillow's conversion;
    32-bit integer beyond 16 bits and floating-point images have no agreed range and are refused."""
    if image.mode in _WIDE_GREY_MODES:
        pixels = np.asarray(image, dtype=np.float64)
        if pixels.size and (pixels.min() < 0 or pixels.max() > 65535):
            raise PPQLikeError(f"image {path!r} is a {image.mode} image with values beyond 16 bits "
                               f"({pixels.min():.0f}..{pixels.max():.0f}); convert it to 8 or 16 bits")
        grey = np.rint(pixels / 257.0).astype(np.uint8)
        return image_module.fromarray(grey, "L").convert("RGB")
    if image.mode == "F":
        raise PPQLikeError(f"image {path!r} holds floating-point pixels (Pillow mode F), whose range ppqlike "
                           "cannot know; save it as an 8- or 16-bit image, or give the data as .npy files")
    return image.convert("RGB")


def list_images(folder: str | os.PathLike) -> list[str]:
    """The image file names in ``folder`` (by suffix), sorted."""
    folder = os.fspath(folder)
    if not os.path.isdir(folder):
        raise CalibrationDataError(f"image folder {folder!r} does not exist or is not a folder")
    return sorted(name for name in os.listdir(folder)
                  if name.lower().endswith(IMAGE_SUFFIXES) and os.path.isfile(os.path.join(folder, name)))


def load_image_folder(folder: str | os.PathLike, limit: int | None = None, **options) -> tuple[np.ndarray, list[str]]:
    """Read the images of ``folder`` (sorted by name, at most ``limit``) as one batch.

    Returns ``(array [N, ...], file names)``; ``options`` are those of
    :func:`load_image`.  A folder without images is a CalibrationDataError.
    """
    names = list_images(folder)
    if limit is not None:
        names = names[:limit]
    if not names:
        raise CalibrationDataError(f"image folder {os.fspath(folder)!r} holds no image files "
                                   f"({', '.join(IMAGE_SUFFIXES)})")
    batch = [load_image(os.path.join(os.fspath(folder), name), **options) for name in names]
    return np.concatenate(batch, axis=0), names


def image_size(path: str | os.PathLike) -> tuple[int, int]:
    """(width, height) of an image file, read from its header only."""
    image_module = _pillow()
    try:
        with image_module.open(os.fspath(path)) as image:
            return image.size
    except (OSError, ValueError) as error:
        raise CalibrationDataError(f"cannot read image {os.fspath(path)!r}: {error}") from None
