"""Argument types of the command line: each parses one option's text or raises argparse's error naming it."""

from __future__ import annotations

import argparse


def channel_numbers(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers") from None
    if len(values) not in (1, 3):
        raise argparse.ArgumentTypeError(f"{text!r}: give one number or three (one per channel)")
    return values


def positive_integer(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def image_size(text: str):
    parts = text.lower().replace("x", ",").split(",")
    try:
        sizes = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: give N or HxW") from None
    if len(sizes) not in (1, 2) or min(sizes) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: give N or HxW")
    return sizes[0] if len(sizes) == 1 else tuple(sizes)


def tensor_shape(text: str) -> list:
    dims = []
    for part in text.replace(" ", "").split(","):
        if part in ("N", "n", "?", "-1", "None"):
            dims.append(None)
            continue
        try:
            dims.append(int(part))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a shape: give e.g. 1,3,224,224 (N for any)") from None
        if dims[-1] <= 0:
            raise argparse.ArgumentTypeError(f"{text!r}: dimensions must be positive")
    return dims
