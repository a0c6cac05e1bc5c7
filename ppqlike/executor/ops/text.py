"""Kernels of the text family: StringConcat, StringSplit, RegexFullMatch, StringNormalizer and
TfIdfVectorizer.

String tensors are numpy object arrays of Python ``str``.  RegexFullMatch uses Python's ``re``, which
reads the common RE2 syntax alike (RE2-only constructs are refused by ``re`` with an error naming the
pattern).  Case changes use Python's Unicode rules.
"""

from __future__ import annotations

import re

import numpy as np

from .base import Kernel, attribute, unsupported

_concatenate = np.frompyfunc(lambda a, b: str(a) + str(b), 2, 1)


def _strings(array) -> np.ndarray:
    """An array of Python str (bytes decoded as UTF-8)."""
    array = np.asarray(array, dtype=object)
    decode = np.frompyfunc(lambda s: s.decode("utf-8") if isinstance(s, bytes) else str(s), 1, 1)
    return np.asarray(decode(array), dtype=object).reshape(array.shape) if array.size else array


def _build_string_concat(op, opset: int) -> Kernel:
    return lambda inputs: [np.asarray(_concatenate(_strings(inputs[0]), _strings(inputs[1])), dtype=object)
                           .reshape(np.broadcast_shapes(np.shape(inputs[0]), np.shape(inputs[1])))]


def _split(text: str, delimiter: str, maxsplit: int | None) -> list[str]:
    """The substrings of one element, as onnxruntime: none for "", runs of spaces as one separator (leading
    and trailing ones dropped) without a delimiter, the rest of the string as the last part after maxsplit."""
    if not text:
        return []
    if delimiter:
        return text.split(delimiter, -1 if maxsplit is None else maxsplit)
    parts = text.strip(" ").split(" ", )
    parts = [p for p in parts if p]
    if maxsplit is not None and len(parts) > maxsplit + 1:
        head = text.lstrip(" ")
        for _ in range(maxsplit):
            head = head.split(" ", 1)[1].lstrip(" ")
        parts = parts[:maxsplit] + [head.rstrip(" ")]
    return parts


def _build_string_split(op, opset: int) -> Kernel:
    """StringSplit: substrings of each element ([*X.shape, most parts], padded with "") and their counts;
    without a delimiter, runs of spaces split and leading/trailing spaces are dropped."""
    delimiter = attribute(op, "delimiter", "")
    maxsplit = attribute(op, "maxsplit", None)
    maxsplit = None if maxsplit is None else int(maxsplit)

    def kernel(inputs):
        x = _strings(inputs[0])
        parts = [_split(s, delimiter, maxsplit) for s in x.reshape(-1)]
        width = max([1] + [len(p) for p in parts])
        y = np.full((len(parts), width), "", dtype=object)
        for row, pieces in enumerate(parts):
            y[row, :len(pieces)] = pieces
        counts = np.array([len(p) for p in parts], np.int64).reshape(x.shape)
        return [y.reshape(x.shape + (width,)), counts]
    return kernel


def _build_regex_full_match(op, opset: int) -> Kernel:
    pattern = attribute(op, "pattern")
    try:
        compiled = re.compile(pattern)
    except re.error as error:
        raise unsupported(op, f"pattern {pattern!r}: {error}") from None
    match = np.frompyfunc(lambda s: compiled.fullmatch(s) is not None, 1, 1)
    return lambda inputs: [np.asarray(match(_strings(inputs[0])), dtype=bool).reshape(np.shape(inputs[0]))]


def _build_string_normalizer(op, opset: int) -> Kernel:
    """StringNormalizer: stop words removed (case-insensitively unless is_case_sensitive), then the case
    changed; a [C] or [1, C] input, and [1] / [1, 1] holding "" when nothing is left."""
    action = attribute(op, "case_change_action", "NONE")
    if action not in ("NONE", "LOWER", "UPPER"):
        raise unsupported(op, f"case_change_action {action!r}")
    sensitive = bool(attribute(op, "is_case_sensitive", 0))
    stopwords = [str(w) for w in attribute(op, "stopwords", [])]
    stop = set(stopwords) if sensitive else {w.lower() for w in stopwords}

    def kernel(inputs):
        x = _strings(inputs[0])
        if x.ndim not in (1, 2) or (x.ndim == 2 and x.shape[0] != 1):
            raise unsupported(op, f"an input of shape {list(x.shape)} (need [C] or [1, C])")
        kept = [s for s in x.reshape(-1) if (s if sensitive else s.lower()) not in stop]
        if action == "LOWER":
            kept = [s.lower() for s in kept]
        elif action == "UPPER":
            kept = [s.upper() for s in kept]
        y = np.array(kept or [""], dtype=object)
        return [y if x.ndim == 1 else y.reshape(1, -1)]
    return kernel


def _build_tfidf_vectorizer(op, opset: int) -> Kernel:
    """TfIdfVectorizer: counts of the pool's n-grams (min to max length, each with up to max_skip_count
    items skipped between its members; 1-grams once) per row, mapped to ngram_indexes; IDF: counts capped
    at 1 times the weights; TFIDF: counts times the weights."""
    mode = attribute(op, "mode")
    if mode not in ("TF", "IDF", "TFIDF"):
        raise unsupported(op, f"mode {mode!r}")
    shortest, longest = int(attribute(op, "min_gram_length")), int(attribute(op, "max_gram_length"))
    max_skip = int(attribute(op, "max_skip_count"))
    starts = [int(v) for v in attribute(op, "ngram_counts")]
    indexes = np.array([int(v) for v in attribute(op, "ngram_indexes")], np.int64)
    pool = attribute(op, "pool_int64s", None)
    strings = pool is None
    pool = list(attribute(op, "pool_strings", [])) if strings else [int(v) for v in pool]
    weights = attribute(op, "weights", None)
    weights = np.ones(len(indexes), np.float32) if weights is None else np.asarray(weights, np.float32)
    grams: dict = {}                      # n-gram (tuple) -> positions in ngram_indexes
    count = 0
    for n, start in enumerate(starts, 1):
        end = starts[n] if n < len(starts) else len(pool)
        for i in range(start, end, n):
            grams.setdefault(tuple(pool[i:i + n]), []).append(count)
            count += 1
    if count != len(indexes):
        raise unsupported(op, f"{count} n-grams in the pool for {len(indexes)} ngram_indexes")
    width = int(indexes.max()) + 1 if indexes.size else 0

    def kernel(inputs):
        x = inputs[0]
        rows = x.reshape(1, -1) if x.ndim <= 1 else x.reshape(x.shape[0], -1)
        rows = [[str(v) if strings else int(v) for v in row] for row in rows]
        counts = np.zeros((len(rows), count), np.float32)
        for r, row in enumerate(rows):
            for n in range(max(shortest, 1), longest + 1):
                for skip in range(0, (max_skip if n > 1 else 0) + 1):
                    step = skip + 1
                    for begin in range(0, len(row) - (n - 1) * step):
                        for position in grams.get(tuple(row[begin:begin + (n - 1) * step + 1:step]), ()):
                            counts[r, position] += 1
        if mode == "IDF":
            counts = np.minimum(counts, 1) * weights
        elif mode == "TFIDF":
            counts = counts * weights
        y = np.zeros((len(rows), width), np.float32)
        for position, index in enumerate(indexes):
            y[:, index] = counts[:, position]
        return [y.reshape(width) if x.ndim <= 1 else y]
    return kernel


KERNELS: dict = {
    "StringConcat": _build_string_concat,
    "StringSplit": _build_string_split,
    "RegexFullMatch": _build_regex_full_match,
    "StringNormalizer": _build_string_normalizer,
    "TfIdfVectorizer": _build_tfidf_vectorizer,
}
