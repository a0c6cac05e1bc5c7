"""Text and byte inputs of the dev set: tokenized sentences and the byte features of real local files."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

SENTENCES = Path(__file__).resolve().parent / "sentences.txt"
PER_TOPIC = 10      # sentences.txt: ten sentences per topic, topic after topic
CALIB_EVERY = 3     # every third sentence calibrates, the others are the dev set
#: where the byte classifier's files come from (read only), and the suffixes sampled there (plus files without one)
FILE_ROOTS = ("/usr", "/etc")
FILE_SUFFIXES = (".py", ".pyc", ".c", ".h", ".cpp", ".so", ".json", ".xml", ".html", ".txt", ".md", ".rst", ".sh",
                 ".pl", ".pm", ".rb", ".js", ".css", ".gz", ".zip", ".whl", ".png", ".jpg", ".svg", ".ttf", ".pem",
                 ".crt", ".conf", ".cfg", ".ini", ".toml", ".yaml", ".csv", ".mo", ".po", ".tcl", ".pyi", ".a",
                 ".bz2", ".xz", ".pdf", ".ico", ".gif", ".tar", ".jar", ".sql", ".go", ".rs", ".java", ".el", "")


def sentences() -> list[str]:
    """The sentences of ``sentences.txt`` in file order (ten per topic)."""
    return [line.strip() for line in SENTENCES.read_text().splitlines() if line.strip() and not line.startswith("#")]


def split_sentences() -> tuple[list[str], list[str]]:
    """Calibration (every CALIB_EVERY-th sentence) and dev (the rest): both cover every topic."""
    lines = sentences()
    return ([s for i, s in enumerate(lines) if i % CALIB_EVERY == 0],
            [s for i, s in enumerate(lines) if i % CALIB_EVERY])


def tokenize(tokenizer_file: Path, texts: list[str], length: int) -> dict[str, np.ndarray]:
    """BERT inputs for ``texts`` padded (or truncated) to ``length`` tokens: input_ids, attention_mask,
    token_type_ids, int64 [N, length], by the model's own ``tokenizer.json`` (the tokenizers package)."""
    from tokenizers import Tokenizer
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    tokenizer.enable_truncation(length)
    tokenizer.enable_padding(length=length, pad_id=tokenizer.token_to_id("[PAD]"), pad_token="[PAD]")
    encodings = tokenizer.encode_batch(texts)
    return {"input_ids": np.array([e.ids for e in encodings], np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], np.int64),
            "token_type_ids": np.array([e.type_ids for e in encodings], np.int64)}


def local_files(rng: np.random.Generator, count: int, per_suffix: int = 24, min_size: int = 64) -> list[Path]:
    """``count`` readable regular files under FILE_ROOTS, at most ``per_suffix`` of each suffix of
    FILE_SUFFIXES, drawn with ``rng`` from the sorted walk (so varied, and the same on the same machine)."""
    by_suffix: dict[str, list[Path]] = {suffix: [] for suffix in FILE_SUFFIXES}
    for root in FILE_ROOTS:
        for folder, dirs, names in os.walk(root):
            dirs.sort()
            for name in sorted(names):
                path = Path(folder) / name
                suffix = path.suffix.lower() if path.suffix.lower() in by_suffix else None
                if suffix is None and "." not in name:
                    suffix = ""
                if suffix is not None and path.is_file() and not path.is_symlink():
                    by_suffix[suffix].append(path)
    chosen: list[Path] = []
    for suffix in FILE_SUFFIXES:
        candidates = by_suffix[suffix]
        order = rng.permutation(len(candidates))
        picked = 0
        for index in order:
            path = candidates[index]
            try:
                if path.stat().st_size >= min_size and os.access(path, os.R_OK):
                    chosen.append(path)
                    picked += 1
            except OSError:
                continue
            if picked == per_suffix:
                break
    if len(chosen) < count:
        raise SystemExit(f"found {len(chosen)} suitable files under {FILE_ROOTS}, {count} are needed")
    return [chosen[i] for i in sorted(rng.choice(len(chosen), count, replace=False))]


def byte_features(path: Path, beg_size: int, end_size: int, block_size: int, padding: int) -> np.ndarray:
    """The content-type classifier's input of a file: the first ``beg_size`` bytes after leading whitespace
    and the last ``end_size`` bytes before trailing whitespace (of at most ``block_size`` bytes read at each
    end), padded with ``padding`` (after the beginning, before the end); int32 [beg_size + end_size]."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        head = handle.read(min(block_size, size)).lstrip()
        handle.seek(max(0, size - block_size))
        tail = handle.read(min(block_size, size)).rstrip()
    begin = list(head[:beg_size]) + [padding] * max(0, beg_size - len(head))
    end = [padding] * max(0, end_size - len(tail)) + list(tail[-end_size:] if tail else b"")
    return np.array(begin + end, np.int32)
