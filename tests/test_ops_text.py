"""StringConcat, StringSplit, RegexFullMatch, StringNormalizer and TfIdfVectorizer against onnxruntime."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from onnx_helpers import assert_matches_onnxruntime

WORDS = ["", "a", "b c", " lead", "trail ", "x,y,,z", "Ünï", "A,b", "  two  spaces ", "tab\there"]


def _strings(shape, seed):
    return np.random.default_rng(seed).choice(np.array(WORDS, dtype=object), size=shape)


@settings(max_examples=15, deadline=None)
@given(pair=st.sampled_from([([3], [3]), ([2, 3], [3]), ([2, 1], [1, 4]), ([], [2])]), seed=st.integers(0, 999))
def test_string_concat(pair, seed):
    assert_matches_onnxruntime("StringConcat", {"x": _strings(pair[0], seed), "y": _strings(pair[1], seed + 1)},
                               opset=20)


@pytest.mark.parametrize("delimiter", [None, "", ",", " ", ",,"])
@pytest.mark.parametrize("maxsplit", [None, 0, 1, 2])
def test_string_split(delimiter, maxsplit):
    attributes = {} if delimiter is None else {"delimiter": delimiter}
    if maxsplit is not None:
        attributes["maxsplit"] = maxsplit
    x = np.array(WORDS[1:], dtype=object).reshape(3, 3)
    assert_matches_onnxruntime("StringSplit", {"x": x}, attributes, opset=20, n_outputs=2)


@pytest.mark.parametrize("pattern", [r"a", r"[a-z ]+", r"\w+,\w+", r".*\s.*", r"(?i)a,B", r"x|y|b c"])
def test_regex_full_match(pattern):
    assert_matches_onnxruntime("RegexFullMatch", {"x": np.array(WORDS, dtype=object).reshape(2, 5)},
                               {"pattern": pattern}, opset=20)


@pytest.mark.parametrize("action", ["NONE", "LOWER", "UPPER"])
@pytest.mark.parametrize("sensitive", [0, 1])
@pytest.mark.parametrize("shape", [[6], [1, 6]])
@pytest.mark.parametrize("stopwords", [[], ["the", "A"], ["ünï", "the", "a", "CAT", "Dog", "eats"]])
def test_string_normalizer(action, sensitive, shape, stopwords):
    """The locale this machine has (onnxruntime refuses en_US.UTF-8 where it is not installed)."""
    x = np.array(["The", "cat", "a", "DOG", "Ünï", "eats"], dtype=object).reshape(shape)
    attributes = {"case_change_action": action, "is_case_sensitive": sensitive, "locale": "C.UTF-8"}
    if stopwords:
        attributes["stopwords"] = stopwords
    assert_matches_onnxruntime("StringNormalizer", {"x": x}, attributes, opset=11)


@pytest.mark.parametrize("mode", ["TF", "IDF", "TFIDF"])
@settings(max_examples=12, deadline=None)
@given(shape=st.sampled_from([[12], [3, 8], [1, 5]]), grams=st.sampled_from([(1, 1), (1, 2), (2, 2), (1, 3), (2, 3)]),
       skip=st.integers(0, 2), strings=st.booleans(), weighted=st.booleans(), seed=st.integers(0, 999))
def test_tfidf_vectorizer(mode, shape, grams, skip, strings, weighted, seed):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 4, shape)
    pool_1 = [0, 1, 3]
    pool_2 = [0, 1, 1, 1, 3, 2]
    pool_3 = [0, 1, 2, 1, 1, 1]
    pool = pool_1 + pool_2 + pool_3
    counts = [0, 3, 9]
    indexes = list(rng.permutation(8))         # 3 one-grams, 3 two-grams, 2 three-grams
    attributes = {"mode": mode, "min_gram_length": grams[0], "max_gram_length": grams[1], "max_skip_count": skip,
                  "ngram_counts": counts, "ngram_indexes": indexes}
    if strings:
        x = np.array([f"w{t}" for t in tokens.reshape(-1)], dtype=object).reshape(shape)
        attributes["pool_strings"] = [f"w{t}" for t in pool]
    else:
        x = tokens.astype(np.int64 if seed % 2 else np.int32)
        attributes["pool_int64s"] = pool
    if weighted:
        attributes["weights"] = [float(w) for w in rng.uniform(0.5, 2, 8)]
    assert_matches_onnxruntime("TfIdfVectorizer", {"x": x}, attributes, opset=11, rtol=1e-6, atol=0)
