"""The image preprocessing a calibration folder applies for one model input: layout and size.

:func:`resolve_image_options` completes :func:`ppqlike.io.images.load_image`'s options from the model's
input shape, and refuses, before any pixel is read, what would not give batches of one size the model
takes: a crop or letterbox that does not fit a fixed input, or images of several sizes for an input whose
height and width are not fixed.  The messages name the input and the command-line options that fix it.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from ..core.errors import CalibrationDataError
from .images import image_size


def _static(dim) -> int | None:
    return int(dim) if isinstance(dim, (int, np.integer)) and dim > 0 else None


def _pair(size) -> tuple[int, int]:
    return (int(size), int(size)) if isinstance(size, (int, np.integer)) else tuple(int(v) for v in size)


def resolve_image_options(name: str, shape: Sequence | None, options: dict, folder: str,
                          files: Sequence[str]) -> dict:
    """``options`` (load_image's keywords) completed for model input ``name`` of ``shape``.

    ``layout`` defaults to the shape's ([N,3,H,W] NCHW, [N,H,W,3] NHWC; else NCHW).  ``letterbox``: a size,
    or True for the input's fixed height and width; it replaces resize and crop.  Otherwise ``crop``
    defaults to the input's fixed height and width, and ``resize_shorter`` to the crop's larger side
    (the crop then takes the centre of the whole image).  An input without a fixed height and width and
    no size in the options needs images of one size (after ``resize_shorter``), read from their headers.
    """
    if shape is not None and len(shape) != 4:
        raise CalibrationDataError(f"calibration folder {folder!r} holds images, but model input {name!r} has "
                                   f"shape {list(shape)}, not an image batch [N,3,H,W] or [N,H,W,3]; give .npy "
                                   "files instead")
    if shape is not None and options.get("layout") is None:
        if _static(shape[1]) == 3:
            options["layout"] = "NCHW"
        elif _static(shape[3]) == 3:
            options["layout"] = "NHWC"
    options["layout"] = layout = str(options.get("layout") or "NCHW").upper()
    height = width = None
    if shape is not None and layout in ("NCHW", "NHWC"):
        channels, height, width = (shape[1], shape[2], shape[3]) if layout == "NCHW" else \
            (shape[3], shape[1], shape[2])
        if _static(channels) not in (None, 3):
            raise CalibrationDataError(
                f"model input {name!r} has shape {list(shape)}: in {layout} layout that is {channels} "
                f"channel(s), but images give 3 (RGB/BGR); check the layout, or give .npy files instead")
    fixed = (int(height), int(width)) if _static(height) and _static(width) else None
    described = f"model input {name!r} of shape {list(shape) if shape is not None else '(unknown)'} ({layout})"
    letterbox = options.get("letterbox")
    if letterbox is not None and letterbox is not False:
        if options.get("crop") is not None or options.get("resize_shorter") is not None:
            raise CalibrationDataError(f"{described}: a letterbox replaces resize and crop; give --letterbox "
                                       "without --resize and --crop")
        if letterbox is True:
            if fixed is None:
                raise CalibrationDataError(
                    f"{described} has no fixed height and width, so the letterbox needs a size: pass "
                    "--letterbox N (or HxW), or --input-shape 1,3,H,W (image_options letterbox=(h, w))")
            letterbox = fixed
        box = _pair(letterbox)
        _check_fits(box, fixed, described, "letterboxed")
        options.update(letterbox=box, resize_shorter=None, crop=None)
        return options
    options.pop("letterbox", None)
    options.pop("letterbox_value", None)
    crop = options.get("crop")
    if crop is not None:
        crop = _pair(crop)
        _check_fits(crop, fixed, described, "cropped")
    elif fixed is not None:
        crop = fixed
    options["crop"] = crop
    if options.get("resize_shorter") is None:
        options["resize_shorter"] = None if crop is None else max(crop)
    if crop is None:
        _check_one_size(described, folder, files, options["resize_shorter"])
    return options


def _check_fits(size: tuple, fixed: tuple | None, described: str, verb: str) -> None:
    if fixed is not None and tuple(size) != fixed:
        raise CalibrationDataError(f"images {verb} to {size[0]}x{size[1]} (height x width) do not fit "
                                   f"{described}, which takes {fixed[0]}x{fixed[1]}")


def _resized(size: tuple[int, int], shorter: int | None) -> tuple[int, int]:
    """(width, height) after load_image resizes the shorter side to ``shorter``."""
    width, height = size
    if not shorter:
        return width, height
    return (shorter, int(shorter * height / width)) if width <= height else (int(shorter * width / height), shorter)


def _check_one_size(described: str, folder: str, files: Sequence[str], shorter: int | None) -> None:
    """Without a crop or letterbox, the images must come out of the resize with one size (headers read)."""
    sizes: dict[tuple[int, int], str] = {}
    for file_name in files:
        sizes.setdefault(_resized(image_size(os.path.join(folder, file_name)), shorter), file_name)
    if len(sizes) > 1:
        shown = ", ".join(f"{w}x{h} ({n})" for (w, h), n in list(sizes.items())[:3])
        after = f" after resizing the shorter side to {shorter}" if shorter else ""
        raise CalibrationDataError(
            f"{described} has no fixed height and width, and the {len(files)} images in {folder!r} have "
            f"{len(sizes)} sizes{after} (width x height: {shown}{', ...' if len(sizes) > 3 else ''}); give them "
            "one size with --letterbox N (detectors), --crop N (resizes the shorter side to N first) or "
            "--input-shape 1,3,H,W (image_options letterbox= or crop=)")
