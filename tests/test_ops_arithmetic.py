"""Arithmetic kernels against onnxruntime: broadcasting, dtypes, Erf accuracy, Cast."""

import math

import numpy as np
import pytest

from onnx_helpers import assert_matches_onnxruntime

from ppqlike.executor.ops.arithmetic import erf, erfc

RNG = np.random.default_rng(0)

SHAPE_PAIRS = [
    ([2, 3, 4, 5], [2, 3, 4, 5]),
    ([2, 3, 4, 5], [3, 1, 1]),
    ([2, 3, 4, 5], [5]),
    ([2, 3, 4, 5], []),
    ([3, 1, 1], [2, 3, 4, 5]),
    ([], []),
    ([4, 1], [1, 3]),
]


def _float(shape, low=-3.0, high=3.0, dtype=np.float32):
    return RNG.uniform(low, high, shape).astype(dtype)


def _int(shape, low=-20, high=20, dtype=np.int32, nonzero=False):
    values = RNG.integers(low, high, shape).astype(dtype)
    if nonzero:
        values[values == 0] = 1
    return values


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("shapes", SHAPE_PAIRS)
def test_binary_float_broadcasting(op, shapes):
    a = _float(shapes[0])
    b = np.asarray(_float(shapes[1], 0.5, 3.0) * np.sign(_float(shapes[1])), np.float32)
    b[b == 0] = 1.0
    assert_matches_onnxruntime(op, {"a": a, "b": b})


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float64])
@pytest.mark.parametrize("opset", [11, 13])
def test_binary_dtypes(op, dtype, opset):
    if np.dtype(dtype).kind == "f":
        a, b = _float([2, 3, 4], dtype=dtype), _float([4], 0.5, 2.0, dtype=dtype)
    else:  # negative operands make integer Div show its rounding (toward zero)
        a, b = _int([2, 3, 4], dtype=dtype), _int([4], -7, 7, dtype=dtype, nonzero=True)
    assert_matches_onnxruntime(op, {"a": a, "b": b}, opset=opset)


def test_div_by_zero_float():
    a = np.array([1.0, -1.0, 0.0, 2.0], np.float32)
    assert_matches_onnxruntime("Div", {"a": a, "b": np.zeros(4, np.float32)})


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_mod_integer(fmod, dtype):
    a, b = _int([2, 3, 4], dtype=dtype), _int([3, 1], -6, 6, dtype=dtype, nonzero=True)
    assert_matches_onnxruntime("Mod", {"a": a, "b": b}, {"fmod": fmod})


def test_mod_float():
    a, b = _float([2, 3, 4], -10, 10), _float([4], 1, 3) * np.array([1, -1, 1, -1], np.float32)
    assert_matches_onnxruntime("Mod", {"a": a, "b": b}, {"fmod": 1})


@pytest.mark.parametrize("base_dtype,exp_dtype", [
    (np.float32, np.float32), (np.float32, np.int32), (np.float32, np.int64), (np.float32, np.float64),
    (np.float64, np.float32), (np.int32, np.int32), (np.int64, np.int64), (np.int64, np.float32),
    (np.int32, np.float64)])
@pytest.mark.parametrize("opset", [12, 13])
def test_pow_mixed_dtypes(base_dtype, exp_dtype, opset):
    if np.dtype(base_dtype).kind == "f":
        base = _float([2, 3, 4], 0.1, 3.0, dtype=base_dtype)
    else:
        base = _int([2, 3, 4], -5, 6, dtype=base_dtype)
    if np.dtype(exp_dtype).kind == "f":
        exponent = _float([4], -2.0, 3.0, dtype=exp_dtype)
    else:  # includes negative integer exponents: x ** -n truncates to 0 unless |x| = 1
        exponent = _int([4], -2, 5, dtype=exp_dtype)
    assert_matches_onnxruntime("Pow", {"a": base, "b": exponent}, opset=opset, rtol=2e-5)


@pytest.mark.parametrize("exponent", [2.0, 0.5, 3.0, -1.0])
def test_pow_scalar_exponent_initializer(exponent):
    base = _float([2, 3, 4, 5], -3, 3)
    if exponent == 0.5:
        base = np.abs(base)
    assert_matches_onnxruntime("Pow", {"a": base, "b": np.array(exponent, np.float32)},
                               initializers={"b"})


def test_pow_negative_base_fractional_exponent_is_nan():
    base = np.array([-2.0, 2.0, -8.0], np.float32)
    assert_matches_onnxruntime("Pow", {"a": base, "b": np.array([0.5, 0.5, 1 / 3], np.float32)})


UNARY_FLOAT = {
    "Sqrt": (0.0, 9.0), "Exp": (-10.0, 10.0), "Log": (0.01, 100.0), "Erf": (-5.0, 5.0),
    "Neg": (-3.0, 3.0), "Abs": (-3.0, 3.0), "Reciprocal": (0.1, 3.0), "Floor": (-3.0, 3.0),
    "Ceil": (-3.0, 3.0), "Sign": (-3.0, 3.0),
}


@pytest.mark.parametrize("op", sorted(UNARY_FLOAT))
@pytest.mark.parametrize("shape", [[2, 3, 4, 5], []])
def test_unary_float(op, shape):
    low, high = UNARY_FLOAT[op]
    assert_matches_onnxruntime(op, {"x": _float(shape, low, high)})


@pytest.mark.parametrize("op", ["Sqrt", "Log", "Exp", "Reciprocal"])
def test_unary_special_values(op):
    x = np.array([-1.0, 0.0, -0.0, np.inf, -np.inf, np.nan, 100.0, -100.0], np.float32)
    assert_matches_onnxruntime(op, {"x": x})


@pytest.mark.parametrize("op", ["Exp", "Sqrt", "Neg", "Abs"])  # onnxruntime has no double Erf
def test_unary_double(op):
    assert_matches_onnxruntime(op, {"x": _float([3, 7], 0.0 if op == "Sqrt" else -4.0, 4.0, np.float64)},
                               rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("op", ["Neg", "Abs", "Sign"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_unary_integer(op, dtype):
    assert_matches_onnxruntime(op, {"x": _int([3, 4], dtype=dtype)})


def test_round_half_to_even():
    x = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.49999997, 2.6, -2.6], np.float32)
    assert_matches_onnxruntime("Round", {"x": x}, opset=11, exact=True)


def test_erf_accuracy_against_math_erf():
    x = np.concatenate([np.linspace(-6, 6, 600_001), RNG.normal(0, 1.5, 400_000)])
    expected = np.array([math.erf(v) for v in x])
    assert np.max(np.abs(erf(x) - expected)) < 1e-15
    x32 = x.astype(np.float32)
    expected32 = np.array([math.erf(v) for v in x32.astype(np.float64)])
    got32 = erf(x32)
    assert got32.dtype == np.float32
    assert np.max(np.abs(got32.astype(np.float64) - expected32)) < 2e-7


def test_erfc_relative_accuracy():
    x = np.linspace(-5, 26, 20_001)
    expected = np.array([math.erfc(v) for v in x])
    assert np.max(np.abs(erfc(x) - expected) / expected) < 1e-12
    assert np.isnan(erf(np.array([np.nan], np.float32))).all()
    np.testing.assert_array_equal(erf(np.array([np.inf, -np.inf, 0.0])), [1.0, -1.0, 0.0])


CAST_SOURCE = np.array([-300.5, -2.7, -0.5, -0.0, 0.0, 0.5, 1.0, 2.7, 127.9, 255.5, 300.5, 40000.0, 5e9],
                       np.float32)


@pytest.mark.parametrize("to", [1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13])
def test_cast_from_float(to):
    assert_matches_onnxruntime("Cast", {"x": CAST_SOURCE}, {"to": to}, exact=True)


@pytest.mark.parametrize("to", [1, 3, 6, 7, 9, 11])
@pytest.mark.parametrize("source", [
    np.array([-200, -1, 0, 1, 300, 2**31 - 1], np.int64),
    np.array([True, False, True]),
    np.array([[1.5, -2.25], [np.nan, np.inf]], np.float64),
])
def test_cast_other_sources(to, source):
    if source.dtype.kind == "f" and to not in (1, 9, 11):
        source = source[:1]  # NaN / inf to integers is undefined behaviour in C
    assert_matches_onnxruntime("Cast", {"x": source}, {"to": to}, exact=True)


def test_cast_nan_to_bool_and_half():
    x = np.array([np.nan, np.inf, -np.inf, 0.0, 1e-8, 70000.0], np.float32)
    assert_matches_onnxruntime("Cast", {"x": x}, {"to": 9})
    assert_matches_onnxruntime("Cast", {"x": x}, {"to": 10})


def test_cast_does_not_alias_its_input():
    x = _float([3])
    out, = assert_matches_onnxruntime("Cast", {"x": x}, {"to": 1})
    assert not np.shares_memory(out, x)


@pytest.mark.parametrize("like", [np.zeros(1, np.int32), np.zeros(1, np.float16), np.zeros(1, np.uint8)])
def test_cast_like(like):
    assert_matches_onnxruntime("CastLike", {"x": CAST_SOURCE[:9], "like": like}, opset=15, exact=True)


def test_cast_rejects_string_target():
    from ppqlike.core.errors import UnsupportedOperationError
    from ppqlike.core.ir import Operation
    from ppqlike.executor.ops import build_kernel
    with pytest.raises(UnsupportedOperationError):
        build_kernel(Operation("c", "Cast", {"to": 8}), 13)


def test_kernels_do_not_modify_inputs():
    from ppqlike.core.ir import Operation
    from ppqlike.executor.ops import build_kernel
    a, b = _float([2, 3]), _float([3], 1, 2)
    saved = a.copy(), b.copy()
    for op in ["Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Exp", "Erf", "Neg", "Abs", "Reciprocal"]:
        build_kernel(Operation("n", op), 13)([a, b])
        np.testing.assert_array_equal(a, saved[0])
        np.testing.assert_array_equal(b, saved[1])
