"""Gemm and MatMul against onnxruntime."""

import itertools

import numpy as np
import pytest

from onnx_helpers import assert_matches_onnxruntime

RTOL, ATOL = 1e-5, 1e-5


def _data(*shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("trans_a,trans_b", list(itertools.product([0, 1], [0, 1])))
@pytest.mark.parametrize("alpha,beta", [(1.0, 1.0), (0.5, 2.0), (-1.5, 0.0)])
def test_gemm_transpositions_and_scales(trans_a, trans_b, alpha, beta):
    m, k, n = 5, 7, 4
    a = _data(*((k, m) if trans_a else (m, k)), seed=1)
    b = _data(*((n, k) if trans_b else (k, n)), seed=2)
    c = _data(m, n, seed=3)
    assert_matches_onnxruntime("Gemm", {"a": a, "b": b, "c": c},
                               {"transA": trans_a, "transB": trans_b, "alpha": alpha, "beta": beta},
                               initializers={"b", "c"}, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("c_shape", [(), (1,), (4,), (1, 4), (5, 1), (5, 4), None])
@pytest.mark.parametrize("beta", [1.0, 0.25])
def test_gemm_bias_broadcast(c_shape, beta):
    inputs = {"a": _data(5, 3, seed=4), "b": _data(3, 4, seed=5),
              "c": None if c_shape is None else _data(*c_shape, seed=6)}
    assert_matches_onnxruntime("Gemm", inputs, {"beta": beta}, initializers={"b"}, rtol=RTOL, atol=ATOL)


def test_gemm_classifier_head_shape():
    # the EfficientNet head: [N, 1280] x [1000, 1280]^T + [1000]
    inputs = {"a": _data(3, 64, seed=7), "b": _data(10, 64, seed=8), "c": _data(10, seed=9)}
    assert_matches_onnxruntime("Gemm", inputs, {"transB": 1}, initializers={"b", "c"}, rtol=RTOL, atol=ATOL)


def test_gemm_float64():
    inputs = {"a": _data(4, 3, dtype=np.float64), "b": _data(3, 2, seed=1, dtype=np.float64)}
    assert_matches_onnxruntime("Gemm", inputs, {"alpha": 2.0}, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("a_shape,b_shape", [
    ((3, 4), (4, 5)),
    ((4,), (4, 5)),
    ((3, 4), (4,)),
    ((4,), (4,)),
    ((2, 3, 4), (4, 5)),
    ((4,), (2, 4, 5)),
    ((2, 3, 4), (2, 4, 5)),
    ((2, 1, 3, 4), (6, 4, 5)),
    ((1, 3, 4), (2, 2, 4, 5)),
])
def test_matmul_shapes(a_shape, b_shape):
    inputs = {"a": _data(*a_shape, seed=10), "b": _data(*b_shape, seed=11)}
    assert_matches_onnxruntime("MatMul", inputs, rtol=RTOL, atol=ATOL)


def test_matmul_weight_initializer_and_int32():
    assert_matches_onnxruntime("MatMul", {"a": _data(2, 5, 8), "b": _data(8, 3, seed=1)},
                               initializers={"b"}, rtol=RTOL, atol=ATOL)
    ints = {"a": np.arange(12, dtype=np.int32).reshape(3, 4), "b": np.arange(8, dtype=np.int32).reshape(4, 2)}
    assert_matches_onnxruntime("MatMul", ints, exact=True)


@pytest.mark.parametrize("a_shape,b_shape", [((4, 197, 384), (384, 96)),          # rows of a split
                                             ((4, 6, 197, 64), (4, 6, 64, 197)),  # batch split
                                             ((3, 6, 100, 64), (1, 6, 64, 100)),  # broadcast batch
                                             ((2, 3, 64), (2, 64, 5))])           # too small: one call
@pytest.mark.parametrize("threads", [2, 3])
def test_matmul_split_over_threads_agrees_with_onnxruntime(a_shape, b_shape, threads, monkeypatch):
    from ppqlike.executor.ops import _threads, linear
    monkeypatch.setattr(linear, "_SPLIT_ABOVE", 1 << 12)
    _threads.set_num_threads(threads)
    try:
        inputs = {"a": _data(*a_shape, seed=10), "b": _data(*b_shape, seed=11)}
        assert_matches_onnxruntime("MatMul", inputs, {}, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(linear.matmul(inputs["a"], inputs["b"]), np.matmul(inputs["a"], inputs["b"]),
                                   rtol=1e-4, atol=1e-4)
    finally:
        _threads.set_num_threads(None)


@pytest.mark.parametrize("a_shape,b_shape", [((197 * 4, 96), (96, 288)), ((8, 200, 64), (8, 64, 200))])
def test_matmul_result_does_not_depend_on_the_thread_count(a_shape, b_shape):
    """OpenBLAS's sums depend on how the rows are cut: the cuts are the same whatever the thread count, so
    1, 2 and 3 kernel threads give the same bits (calibration, and so the scales, must not change with it)."""
    from ppqlike.executor.ops import _threads, linear
    a, b = _data(*a_shape, seed=12), _data(*b_shape, seed=13)
    assert a[..., 0].size * a.shape[-1] * b.shape[-1] >= linear._SPLIT_ABOVE   # large enough to be cut
    results = []
    try:
        for threads in (1, 2, 3):
            _threads.set_num_threads(threads)
            results.append(linear.matmul(a, b))
    finally:
        _threads.set_num_threads(None)
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[0], results[2])
    np.testing.assert_allclose(results[0], np.matmul(a, b), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("a_shape,b_shape,dtype", [((4, 197, 384), (384, 96), np.float32),          # row pieces
                                                   ((4, 6, 197, 64), (4, 6, 64, 197), np.float32),  # batch parts
                                                   ((2, 3, 64), (2, 64, 5), np.float32),            # one call
                                                   ((64,), (64, 5), np.float32),                    # 1-D operand
                                                   ((4, 197, 384), (384, 96), np.float64)])         # after it
def test_matmul_epilogue_gives_the_bytes_of_the_epilogue_after_it(a_shape, b_shape, dtype):
    """The epilogue done on each piece of the product as it is made (the kernel threads' pieces) leaves the
    bytes that doing it on the whole product afterwards does."""
    from ppqlike.core.numerics import fake_quantizer
    from ppqlike.executor.ops import _threads, linear
    quantize = fake_quantizer(np.float32(0.5), 0, -128, 127)
    pieces = []

    def epilogue(block):
        pieces.append(block.shape)
        quantize(block, block)
    a, b = _data(*a_shape, seed=14).astype(dtype), _data(*b_shape, seed=15).astype(dtype)
    _threads.set_num_threads(2)
    try:
        got = linear.matmul(a, b, epilogue)
        want = linear.matmul(a, b)
    finally:
        _threads.set_num_threads(None)
    quantize(want, want)
    assert got.tobytes() == want.tobytes()
    large = a[..., 0].size * a.shape[-1] * b.shape[-1] >= linear._SPLIT_ABOVE
    assert len(pieces) == (1 if dtype != np.float32 or not large else linear._ROW_PIECES if b.ndim == 2 else 2)
