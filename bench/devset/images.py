"""Image inputs of the dev set: real photographs, rendered document pages and rendered text lines.

Photographs are the shared ImageNet JPEGs (``../shared/bench/images``), letterboxed as YOLO exporters expect.
Documents and text lines are drawn with Pillow in DejaVu fonts (Debian's fonts-dejavu-core; Pillow's own font
otherwise) from the English sentences of ``sentences.txt``, with photographs as figures, tables, headers and
footers, so that a layout detector, a text detector and a text recogniser see what they were trained for.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

FONT_DIR = Path("/usr/share/fonts/truetype/dejavu")
FONT_FILES = ("DejaVuSans.ttf", "DejaVuSerif.ttf", "DejaVuSansCondensed.ttf", "DejaVuSansMono.ttf")
BOLD_FILES = ("DejaVuSans-Bold.ttf", "DejaVuSerif-Bold.ttf")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@lru_cache(maxsize=64)
def font(size: int, index: int = 0, bold: bool = False) -> ImageFont.ImageFont:
    """A TrueType font of ``size`` pixels (DejaVu ``index`` of FONT_FILES or BOLD_FILES)."""
    files = BOLD_FILES if bold else FONT_FILES
    path = FONT_DIR / files[index % len(files)]
    if path.is_file():
        return ImageFont.truetype(str(path), size)
    return ImageFont.load_default(size)


def photo_files(bench_dir: Path, split: str, count: int) -> list[Path]:
    """The first ``count`` JPEGs of the shared bench's ``split`` ('calib' or 'dev'), sorted by name."""
    folder = bench_dir / "images" / split
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in (".jpeg", ".jpg", ".png"))
    if len(files) < count:
        raise SystemExit(f"{folder} has {len(files)} images, {count} are needed")
    return files[:count]


def letterbox(path: Path, size: int) -> np.ndarray:
    """An RGB photo scaled to fit ``size`` x ``size`` (aspect kept, grey 114 borders), [3, size, size] in [0, 1]."""
    image = Image.open(path).convert("RGB")
    scale = size / max(image.size)
    width, height = max(1, round(image.width * scale)), max(1, round(image.height * scale))
    canvas = Image.new("RGB", (size, size), (114, 114, 114))
    canvas.paste(image.resize((width, height), Image.BILINEAR), ((size - width) // 2, (size - height) // 2))
    return np.asarray(canvas, np.float32).transpose(2, 0, 1) / 255.0


def _wrap(text: str, face: ImageFont.ImageFont, width: int) -> list[str]:
    lines, line = [], ""
    for word in text.split():
        candidate = f"{line} {word}".strip()
        if line and face.getlength(candidate) > width:
            lines.append(line)
            line = word
        else:
            line = candidate
    return lines + ([line] if line else [])


def _paragraph(draw, rng, sentences, x, y, width, face, bottom) -> int:
    """Draws a paragraph of 2-5 sentences from (x, y); returns the y below it."""
    text = " ".join(rng.choice(sentences, size=int(rng.integers(2, 6))))
    step = int(face.size * 1.35)
    for line in _wrap(text, face, width):
        if y + step > bottom:
            break
        draw.text((x, y), line, fill=(20, 20, 20), font=face)
        y += step
    return y + step // 2


def _table(draw, rng, x, y, width, face, bottom) -> int:
    rows, columns = int(rng.integers(3, 7)), int(rng.integers(3, 6))
    row_height, cell = int(face.size * 1.8), width // columns
    rows = min(rows, max(1, (bottom - y) // row_height - 1))
    for r in range(rows + 1):
        draw.line((x, y + r * row_height, x + cell * columns, y + r * row_height), fill=(40, 40, 40), width=2)
    for c in range(columns + 1):
        draw.line((x + c * cell, y, x + c * cell, y + rows * row_height), fill=(40, 40, 40), width=2)
    for r in range(rows):
        for c in range(columns):
            value = f"{rng.uniform(0, 1000):.{int(rng.integers(0, 3))}f}" if r else f"Col {c + 1}"
            draw.text((x + c * cell + 6, y + r * row_height + 4), value, fill=(20, 20, 20), font=face)
    return y + rows * row_height + row_height


def document_page(rng: np.random.Generator, sentences: list[str], photos: list[Path],
                  size: tuple[int, int] = (1216, 1600)) -> Image.Image:
    """A rendered page (RGB, ``size`` = width, height): header, title, one or two columns of paragraphs, a
    figure (a photograph) with caption, perhaps a table with caption, a footer with the page number."""
    width, height = size
    page = Image.new("RGB", size, tuple(int(v) for v in rng.integers(238, 256, 3)))
    draw = ImageDraw.Draw(page)
    margin, body = int(width * 0.08), int(rng.integers(19, 27))
    regular, small = font(body, int(rng.integers(0, 3))), font(int(body * 0.8), 0)
    draw.text((margin, margin // 2), f"Journal of Everyday Things, vol. {rng.integers(1, 40)}", fill=(90, 90, 90),
              font=small)
    title = " ".join(rng.choice(sentences).split()[:int(rng.integers(4, 9))]).rstrip(".,")
    y = margin + 10
    for line in _wrap(title, font(int(body * 1.7), int(rng.integers(0, 2)), bold=True), width - 2 * margin):
        draw.text((margin, y), line, fill=(0, 0, 0), font=font(int(body * 1.7), 0, bold=True))
        y += int(body * 2.3)
    columns = int(rng.integers(1, 3))
    gap = int(width * 0.04)
    column_width = (width - 2 * margin - (columns - 1) * gap) // columns
    bottom = height - margin - body * 2
    figure_column, table_column = int(rng.integers(0, columns)), int(rng.integers(0, columns))
    for column in range(columns):
        x, cy = margin + column * (column_width + gap), y + body
        while cy < bottom - body * 3:
            kind = rng.random()
            if column == figure_column and kind < 0.3 and cy < bottom - 300:
                photo = Image.open(photos[int(rng.integers(len(photos)))]).convert("RGB")
                fig_width = int(column_width * rng.uniform(0.6, 1.0))
                fig_height = min(int(fig_width * photo.height / photo.width), bottom - cy - body * 3)
                page.paste(photo.resize((fig_width, fig_height), Image.BILINEAR), (x, cy))
                cy += fig_height + body // 2
                draw.text((x, cy), f"Figure {rng.integers(1, 9)}. " + str(rng.choice(sentences))[:60],
                          fill=(30, 30, 30), font=small)
                cy += body * 2
                figure_column = -1
            elif column == table_column and kind < 0.45 and cy < bottom - 250:
                draw.text((x, cy), f"Table {rng.integers(1, 9)}: " + str(rng.choice(sentences))[:50],
                          fill=(30, 30, 30), font=small)
                cy = _table(draw, rng, x, cy + body * 2, column_width, small, bottom)
                table_column = -1
            else:
                cy = _paragraph(draw, rng, sentences, x, cy, column_width, regular, bottom)
    draw.text((width // 2 - body, height - margin), str(rng.integers(1, 300)), fill=(60, 60, 60), font=small)
    return page


def normalized(image: Image.Image, size: tuple[int, int], mean, std, bgr: bool = False) -> np.ndarray:
    """``image`` resized to ``size`` (height, width), [3, H, W] float32: (x / 255 - mean) / std."""
    array = np.asarray(image.convert("RGB").resize(size[::-1], Image.BILINEAR), np.float32) / 255.0
    if bgr:
        array = array[..., ::-1]
    return ((array - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)).transpose(2, 0, 1).copy()


def page_crop(rng: np.random.Generator, page: Image.Image, size: tuple[int, int]) -> Image.Image:
    """A crop of ``page`` of the aspect of ``size`` (height, width), 50-80% of the page's width, so that text
    lines are as tall as a text detector sees them in a photographed page."""
    height, width = size
    crop_width = int(page.width * rng.uniform(0.5, 0.8))
    crop_height = min(page.height, int(crop_width * height / width))
    left = int(rng.integers(0, page.width - crop_width + 1))
    top = int(rng.integers(0, page.height - crop_height + 1))
    return page.crop((left, top, left + crop_width, top + crop_height))


def text_line(rng: np.random.Generator, sentences: list[str], height: int = 48,
              width: int = 320) -> tuple[np.ndarray, str]:
    """A rendered line of text as PP-OCR's recogniser reads it, and the text: [3, height, width] RGB, the line
    resized to ``height`` (aspect kept, at most ``width``), (x / 255 - 0.5) / 0.5, zero to the right."""
    words = str(rng.choice(sentences)).split()
    start = int(rng.integers(0, max(1, len(words) - 2)))
    text = " ".join(words[start:start + int(rng.integers(1, 6))])
    if rng.random() < 0.25:
        text = f"{rng.integers(0, 100000)} {text}" if rng.random() < 0.5 else f"{text} {rng.uniform(0, 99):.2f}"
    face = font(int(rng.integers(26, 40)), int(rng.integers(0, 4)), bold=bool(rng.random() < 0.2))
    ink = tuple(int(v) for v in rng.integers(0, 90, 3))
    paper = tuple(int(v) for v in rng.integers(170, 256, 3))
    left, top, right, bottom = face.getbbox(text)
    pad = int(rng.integers(4, 12))
    image = Image.new("RGB", (right - left + 2 * pad, bottom - top + 2 * pad), paper)
    ImageDraw.Draw(image).text((pad - left, pad - top), text, fill=ink, font=face)
    if rng.random() < 0.4:
        image = image.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.3, 1.2))))
    scaled = min(width, max(8, round(height * image.width / image.height)))
    array = np.asarray(image.resize((scaled, height), Image.BILINEAR), np.float32) / 255.0
    array = array + rng.normal(0, rng.uniform(0, 0.04), array.shape).astype(np.float32)
    line = np.zeros((3, height, width), np.float32)
    line[:, :, :scaled] = (np.clip(array, 0, 1).transpose(2, 0, 1) - 0.5) / 0.5
    return line, text
