"""Tests of ppqlike.optim.observers: streaming calibration observers (DESIGN.md §5 step 4)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ppqlike.core.errors import CalibrationDataError, QuantizationPolicyError
from ppqlike.core.numerics import minmax_to_scale_offset
from ppqlike.core.quant import QuantizationPolicy, QuantizationStates, TensorQuantizationConfig
from ppqlike.core.quant_policy import QuantizationProperty as QP
from ppqlike.optim.observers import (
    OBSERVER_TYPES, HistogramObserver, KLObserver, MeanMinMaxObserver, MinMaxObserver, MSEObserver, Observer,
    PercentileObserver, SearchObserver, kl_best_bins, kl_divergences, make_observer,
)
from ppqlike.optim.observers.histogram import SAMPLED_VALUES, TAIL_SHARE, sample_stride

ALGORITHMS = ["minmax", "mean_minmax", "percentile", "kl", "entropy", "mse", "search", "auto", "unit"]
HISTOGRAM_ALGORITHMS = ["percentile", "kl", "mse", "search"]


def config(algorithm="minmax", symmetric=True, per_channel=False, axis=None, power_of_2=False,
           bits=8, quant_min=None, quant_max=None, name="act"):
    flags = (QP.PER_CHANNEL if per_channel else QP.PER_TENSOR) | QP.LINEAR
    flags |= QP.SYMMETRICAL if symmetric else QP.ASYMMETRICAL
    if power_of_2:
        flags |= QP.POWER_OF_2
    return TensorQuantizationConfig(QuantizationPolicy(flags), num_of_bits=bits, quant_min=quant_min,
                                    quant_max=quant_max, observer_algorithm=algorithm,
                                    channel_axis=axis, name=name)


def observer(algorithm="minmax", **kwargs) -> Observer:
    return make_observer(config(algorithm, **kwargs))


@pytest.fixture(scope="module")
def gaussian_with_outliers():
    rng = np.random.default_rng(0)
    return np.concatenate([rng.standard_normal(1_000_000), np.full(10, 50.0)]).astype(np.float32)


# --------------------------------------------------------------- registry --
def test_registry_is_read_only_and_complete():
    assert set(OBSERVER_TYPES) == set(ALGORITHMS)
    assert OBSERVER_TYPES["entropy"] is OBSERVER_TYPES["kl"] is KLObserver
    assert (OBSERVER_TYPES["minmax"], OBSERVER_TYPES["percentile"], OBSERVER_TYPES["mse"], OBSERVER_TYPES["search"],
            OBSERVER_TYPES["mean_minmax"]) == (MinMaxObserver, PercentileObserver, MSEObserver, SearchObserver,
                                               MeanMinMaxObserver)
    with pytest.raises(TypeError):
        OBSERVER_TYPES["mine"] = MinMaxObserver
    for name, cls in OBSERVER_TYPES.items():
        obs = make_observer(config(name.upper()))
        assert type(obs) is cls and isinstance(obs, Observer)
        assert obs.algorithm == ("kl" if name == "entropy" else name)


def test_unknown_algorithm_lists_the_valid_names():
    with pytest.raises(QuantizationPolicyError) as info:
        make_observer(config("isotone", name="conv1.out"))
    message = str(info.value)
    assert "isotone" in message and "conv1.out" in message
    assert all(name in message for name in ALGORITHMS)


def test_bad_options_raise():
    with pytest.raises(QuantizationPolicyError):
        make_observer(config("kl"), bins=1000)
    with pytest.raises(QuantizationPolicyError):
        make_observer(config("percentile"), percentile=20)
    with pytest.raises(QuantizationPolicyError):
        make_observer(config("minmax"), bins=2048)
    with pytest.raises(QuantizationPolicyError):
        make_observer(config("search", per_channel=True, axis=0))


# ---------------------------------------------------------------- min-max --
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_per_channel_minmax_matches_numpy(axis):
    rng = np.random.default_rng(1)
    obs = observer("minmax", per_channel=True, axis=axis)
    batches = [rng.normal(size=(4, 6, 5)).astype(np.float32) * (i + 1) for i in range(3)]
    for b in batches:
        obs.observe(b)
    data = np.concatenate(batches, axis=0 if axis != 0 else 1)
    other = tuple(a for a in range(3) if a != axis % 3)
    lo, hi = obs.thresholds()
    assert lo.shape == hi.shape == (data.shape[axis],)
    np.testing.assert_array_equal(lo, data.min(axis=other))
    np.testing.assert_array_equal(hi, data.max(axis=other))


def test_per_tensor_thresholds_are_0d_and_channel_count_is_fixed():
    obs = observer("minmax")
    obs.observe(np.array([[-1.0, 2.0]], np.float32))
    lo, hi = obs.thresholds()
    assert lo.shape == () and float(lo) == -1.0 and float(hi) == 2.0
    pc = observer("kl", per_channel=True, axis=1)
    pc.observe(np.ones((2, 3, 4), np.float32))
    with pytest.raises(CalibrationDataError, match="channels"):
        pc.observe(np.ones((2, 4, 4), np.float32))


def test_empty_batches_are_ignored_and_no_data_raises():
    obs = observer("kl", name="head.out")
    obs.observe(np.zeros((0, 3), np.float32))
    assert obs.num_batches == 0
    with pytest.raises(CalibrationDataError, match="head.out"):
        obs.thresholds()
    with pytest.raises(CalibrationDataError):
        obs.render()


# -------------------------------------------------------------- NaN / Inf --
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values_raise_naming_the_tensor(algorithm, bad):
    obs = make_observer(config(algorithm, name="stem.relu"))
    obs.observe(np.linspace(-1, 1, 100, dtype=np.float32))
    before = obs.thresholds()
    x = np.linspace(-3, 3, 100, dtype=np.float32)
    x[17] = bad
    with pytest.raises(CalibrationDataError, match="stem.relu"):
        obs.observe(x)
    after = obs.thresholds()   # the bad batch left no trace
    np.testing.assert_array_equal(before, after)


def test_non_finite_values_raise_per_channel():
    obs = observer("percentile", per_channel=True, axis=0, name="w")
    x = np.ones((3, 4), np.float32)
    x[2, 1] = np.nan
    with pytest.raises(CalibrationDataError, match="'w'.*channels \\[2\\]"):
        obs.observe(x)


# ------------------------------------------------------------ fixed state --
@pytest.mark.parametrize("algorithm, per_channel", [(a, pc) for a in ALGORITHMS for pc in (False, True)
                                                     if not (a == "search" and pc)])  # search is per tensor
def test_state_size_does_not_grow_with_batches(algorithm, per_channel):
    rng = np.random.default_rng(2)
    kwargs = dict(per_channel=per_channel, axis=1 if per_channel else None)
    few, many = observer(algorithm, **kwargs), observer(algorithm, **kwargs)
    for i in range(10):
        few.observe(rng.normal(size=(2, 3, 5)).astype(np.float32))
    for i in range(1000):
        many.observe((rng.normal(size=(2, 3, 5)) * (1 + i / 100)).astype(np.float32))
    assert few.state_nbytes == many.state_nbytes > 0
    assert [a.shape for a in few._state_arrays()] == [a.shape for a in many._state_arrays()]
    assert many.num_batches == 1000
    if isinstance(many, HistogramObserver):
        assert many.signed_histogram().sum() == 1000 * 30
        assert many.state_nbytes >= 2 * 2048 * 8 * (3 if per_channel else 1)


# ---------------------------------------------------------------- merging --
def _shards(seed=3):
    rng = np.random.default_rng(seed)
    a = [rng.normal(size=(8, 4, 50)).astype(np.float32) for _ in range(3)]
    b = [(rng.standard_t(3, size=(8, 4, 50)) * 4).astype(np.float32) for _ in range(4)]   # wider range
    return a, b


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("symmetric", [True, False])
def test_merge_equals_observing_the_concatenated_data(algorithm, symmetric):
    a, b = _shards()
    left, right, whole = (observer(algorithm, symmetric=symmetric) for _ in range(3))
    for x in a:
        left.observe(x)
    for x in b:
        right.observe(x)
    whole.observe(np.concatenate(a + b))
    left.merge(right)
    lo, hi = left.thresholds()
    ref_lo, ref_hi = whole.thresholds()
    if isinstance(left, HistogramObserver):
        # power-of-2 ranges re-bin exactly: the merged counts are the counts of the whole data
        np.testing.assert_array_equal(left.signed_histogram(), whole.signed_histogram())
        width = float(whole.bin_width[0])
        assert abs(lo - ref_lo) <= width and abs(hi - ref_hi) <= width
    np.testing.assert_array_equal(lo, ref_lo)
    np.testing.assert_array_equal(hi, ref_hi)
    assert left.num_batches == 7


def test_merge_per_channel_and_order_independence():
    a, b = _shards(4)
    merged, whole, reverse = (observer("kl", per_channel=True, axis=1) for _ in range(3))
    empty = observer("kl", per_channel=True, axis=1)
    other = observer("kl", per_channel=True, axis=1)
    for x in a:
        merged.observe(x)
    for x in b:
        other.observe(x)
    merged.merge(other)
    merged.merge(empty)                      # merging nothing changes nothing
    for x in a + b:
        whole.observe(x)
    for x in reversed(a + b):
        reverse.observe(x)
    for obs in (merged, reverse):
        np.testing.assert_array_equal(obs.signed_histogram(), whole.signed_histogram())
        np.testing.assert_array_equal(obs.thresholds(), whole.thresholds())
    empty.merge(whole)                       # an empty observer adopts the other's state
    np.testing.assert_array_equal(empty.thresholds(), whole.thresholds())


def test_merge_of_mismatched_observers_raises():
    with pytest.raises(QuantizationPolicyError):
        observer("kl").merge(observer("mse"))
    with pytest.raises(QuantizationPolicyError):
        make_observer(config("kl"), bins=1024).merge(observer("kl"))
    x, y = observer("minmax", per_channel=True, axis=0), observer("minmax", per_channel=True, axis=0)
    x.observe(np.ones((3, 2), np.float32))
    y.observe(np.ones((4, 2), np.float32))
    with pytest.raises(CalibrationDataError):
        x.merge(y)


def test_rebinning_keeps_counts_exact_across_many_range_changes():
    rng = np.random.default_rng(5)
    batches = [(rng.normal(size=1000) * 10.0 ** e).astype(np.float32) for e in (-6, -2, 0, 3, 1, 7)]
    step, once = observer("percentile"), observer("percentile")
    for x in batches:
        step.observe(x)
    once.observe(np.concatenate(batches))
    np.testing.assert_array_equal(step.signed_histogram(), once.signed_histogram())
    assert float(step.range_max[0]) > np.abs(np.concatenate(batches)).max() >= float(step.range_max[0]) / 2


@given(size=st.integers(1, 10**9), limit=st.integers(1, 1 << 20))
@settings(max_examples=200, deadline=None)
def test_sample_stride_is_a_prime_that_divides_no_dimension(size, limit):
    stride = sample_stride(size, limit)
    if size <= limit:
        assert stride == 1
        return
    assert all(stride % d for d in range(2, int(stride ** 0.5) + 1)) and stride >= 2   # prime
    assert size % stride != 0                       # so it divides none of the dimensions multiplying to size
    assert -(-size // stride) <= limit              # at most ``limit`` values binned


def test_a_large_tensor_bins_a_strided_sample_and_its_whole_tail():
    rng = np.random.default_rng(11)
    x = rng.standard_normal((4, 16, 64, 80)).astype(np.float32)   # 327680 values > SAMPLED_VALUES
    x.reshape(-1)[1] = -12.5                                     # the extremes, outside the sample
    x.reshape(-1)[2] = 9.0
    stride = sample_stride(x.size)
    assert stride > 1 and -(-x.size // stride) <= SAMPLED_VALUES
    seen = observer("mse")
    seen.observe(x)
    assert float(seen._min[0]) == -12.5 and float(seen._max[0]) == 9.0        # exact, not sampled
    assert float(seen.range_max[0]) == 16.0
    bins = seen.bins
    index = lambda values: (np.floor(values.astype(np.float64) * bins / 16.0) + bins).astype(np.int64)  # noqa: E731
    whole = np.bincount(index(x.reshape(-1)), minlength=2 * bins)
    sample = np.bincount(index(x.reshape(-1)[::stride]), minlength=2 * bins)
    magnitude = sample[bins:] + sample[bins - 1::-1]
    at_or_above = np.cumsum(magnitude[::-1])[::-1]
    first = int(np.argmax(at_or_above <= -(-at_or_above[0] // TAIL_SHARE)))
    tail = np.zeros(2 * bins, bool)
    tail[bins + first:] = tail[:bins - first] = True
    expected = np.where(tail, whole, stride * sample)
    np.testing.assert_array_equal(seen.signed_histogram()[0], expected)
    assert 0 < first < bins and whole[tail].sum() >= x.size // 200            # the tail: every value counted
    assert whole[tail].sum() >= 3 and seen.signed_histogram()[0, index(np.float32([-12.5, 9.0]))].min() >= 1
    assert abs(expected.sum() - x.size) < 0.01 * x.size


# ------------------------------------------------------------- percentile --
@pytest.mark.parametrize("p", [99.99, 99.0, 90.0])
def test_percentile_within_one_bin_of_numpy(p):
    rng = np.random.default_rng(6)
    x = np.concatenate([rng.normal(0.5, 1.0, 300_000), rng.exponential(2.0, 10_000)]).astype(np.float32)
    asym = make_observer(config("percentile", symmetric=False), percentile=p)
    sym = make_observer(config("percentile"), percentile=p)
    for chunk in np.array_split(x, 7):
        asym.observe(chunk)
        sym.observe(chunk)
    width = float(asym.bin_width[0])
    lo, hi = asym.thresholds()
    assert abs(float(hi) - np.percentile(x, p)) <= width
    assert abs(float(lo) - np.percentile(x, 100 - p)) <= width
    _, t = sym.thresholds()
    assert abs(float(t) - np.percentile(np.abs(x), p)) <= width


def test_percentile_per_channel_and_100_is_the_max():
    rng = np.random.default_rng(7)
    x = (rng.normal(size=(64, 5, 30)) * np.arange(1, 6)[None, :, None]).astype(np.float32)
    obs = make_observer(config("percentile", symmetric=False, per_channel=True, axis=1), percentile=99.5)
    obs.observe(x)
    lo, hi = obs.thresholds()
    per = np.moveaxis(x, 1, 0).reshape(5, -1)
    width = obs.bin_width
    assert np.all(np.abs(hi - np.percentile(per, 99.5, axis=1)) <= width)
    assert np.all(np.abs(lo - np.percentile(per, 0.5, axis=1)) <= width)
    full = make_observer(config("percentile", symmetric=False), percentile=100)
    full.observe(x)
    assert float(full.thresholds()[1]) == x.max() and float(full.thresholds()[0]) == x.min()


# --------------------------------------------------------------------- KL --
def _reference_kl(h, levels, eps=1e-4):
    """KL(P||Q) for every i, one i at a time, straight from the definition."""
    h = np.asarray(h, np.float64)
    h = h[: np.flatnonzero(h)[-1] + 1]
    out = []
    for i in range(levels, h.size + 1):
        p = h[:i].copy()
        p[i - 1] += h[i:].sum()
        kept = h[:i]
        q = np.zeros(i)
        for j in range(levels):
            a, b = j * i // levels, (j + 1) * i // levels
            support = p[a:b] > 0
            if support.any():
                q[a:b][support] = kept[a:b].sum() / support.sum()
        q = np.where((q == 0) & (p > 0), eps, q)
        pn, qn = p / p.sum(), q / q.sum()
        m = pn > 0
        out.append(np.sum(pn[m] * np.log(pn[m] / qn[m])) if kept.sum() > 0 else np.inf)
    return np.array(out)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vectorised_kl_matches_the_definition(seed):
    rng = np.random.default_rng(seed)
    h = np.histogram(np.abs(rng.standard_t(4, 20_000)), bins=300)[0]
    h[rng.integers(0, 300, 40)] = 0            # empty bins inside, and maybe at i - 1
    h[-1] = 3                                   # outliers at the far end
    levels = 16
    ours = kl_divergences(h, levels)
    ref = _reference_kl(h, levels)
    np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-9)
    assert kl_best_bins(h, levels) == levels + int(np.argmin(ref))


def test_kl_ignores_a_few_large_outliers(gaussian_with_outliers):
    obs = observer("kl")
    for chunk in np.array_split(gaussian_with_outliers, 4):
        obs.observe(chunk)
    lo, hi = obs.thresholds()
    assert 2.0 < float(hi) < 10.0
    assert float(lo) == max(float(gaussian_with_outliers.min()), -float(hi))
    cfg = obs.config
    obs.render()
    assert cfg.scale < 10.0 / 127.5 and cfg.state is QuantizationStates.INITIAL


def test_kl_asymmetric_relu_data_and_alias():
    rng = np.random.default_rng(8)
    x = np.maximum(rng.normal(size=200_000), 0).astype(np.float32)
    x[:5] = 40.0
    obs = make_observer(config("entropy", symmetric=False))
    obs.observe(x)
    lo, hi = obs.thresholds()
    assert float(lo) == 0.0 and 1.5 < float(hi) < 10.0
    obs.render()
    assert int(obs.config.offset) == 0 and float(obs.config.scale) == pytest.approx(float(hi) / 255, rel=1e-6)


def test_kl_per_channel_and_degenerate_inputs():
    rng = np.random.default_rng(9)
    x = (rng.normal(size=(4000, 3)) * np.array([1.0, 2.0, 4.0])).astype(np.float32)
    x[0] = [30.0, 60.0, 120.0]
    obs = observer("kl", per_channel=True, axis=-1)
    obs.observe(x)
    _, hi = obs.thresholds()
    assert hi.shape == (3,) and np.all(hi < np.array([30.0, 60.0, 120.0]) / 3)
    np.testing.assert_allclose(hi / hi[0], [1, 2, 4], rtol=0.25)
    zeros = observer("kl")
    zeros.observe(np.zeros(100, np.float32))
    assert float(zeros.thresholds()[1]) == 0.0
    zeros.render()
    assert zeros.config.scale > 0
    wide = observer("kl", bits=16)           # more levels than bins: no clipping
    wide.observe(rng.normal(size=10_000).astype(np.float32))
    assert float(wide.thresholds()[1]) == wide.absmax()[0]


def test_other_input_dtypes_are_accepted():
    obs = observer("kl")
    obs.observe(np.arange(-5, 6, dtype=np.int32))
    obs.observe(np.linspace(-2, 2, 9).astype(np.float16))
    obs.observe(np.linspace(-2, 2, 9))
    assert obs.signed_histogram().sum() == 29


# -------------------------------------------------------------------- MSE --
def test_mse_clips_heavy_tails_and_keeps_uniform_ranges():
    # squared error protects large values: a heavy tail is clipped, but not as hard as KL would
    rng = np.random.default_rng(10)
    heavy = observer("mse")
    heavy.observe(rng.standard_t(2, 200_000).astype(np.float32))
    _, hi = heavy.thresholds()
    assert float(hi) < 0.7 * heavy.absmax()[0]
    uniform = observer("mse")
    uniform.observe(rng.uniform(-1, 1, 200_000).astype(np.float32))
    _, hi = uniform.thresholds()
    assert float(hi) >= 0.97 * uniform.absmax()[0]
    relu = observer("mse", symmetric=False, bits=4)       # coarse grids clip harder
    relu.observe(np.maximum(rng.laplace(size=200_000), 0).astype(np.float32))
    lo, hi = relu.thresholds()
    assert float(lo) == 0.0 and float(hi) < 0.6 * relu.absmax()[0]


def test_mse_error_estimate_matches_the_rendered_quantizer():
    rng = np.random.default_rng(11)
    x = rng.laplace(size=100_000).astype(np.float32)
    obs = observer("mse")
    obs.observe(x)
    _, _, err = obs.candidate_errors()
    actual = []
    for k in (20, 60, 99):
        cfg = config("minmax")
        t = (k + 1) / 100 * obs.absmax()[0]
        cfg.set_scale_offset(*minmax_to_scale_offset(-t, t, cfg.quant_min, cfg.quant_max, True))
        actual.append(float(np.sum((cfg.fake_quantize(x).astype(np.float64) - x) ** 2)))
    np.testing.assert_allclose(err[[20, 60, 99]], actual, rtol=0.1)


# ----------------------------------------------------------------- search --
def test_search_candidates_and_select(gaussian_with_outliers):
    obs = observer("search")
    obs.observe(gaussian_with_outliers)
    kl = observer("kl")
    kl.observe(gaussian_with_outliers)
    candidates = obs.candidates()
    assert len(candidates) >= 20
    assert candidates[0] == pytest.approx(float(kl.thresholds()[1]))
    assert candidates[-1] == 50.0 and candidates == sorted(candidates)
    np.testing.assert_array_equal(obs.thresholds(), kl.thresholds())   # KL until select()
    obs.select(candidates[5])
    lo, hi = obs.thresholds()
    assert float(hi) == candidates[5] and float(lo) == max(gaussian_with_outliers.min(), -candidates[5])
    obs.render()
    assert float(obs.config.scale) == pytest.approx(candidates[5] / 127.5, rel=1e-6)
    obs.select(candidates[-1])
    assert float(obs.thresholds()[1]) == 50.0
    with pytest.raises(CalibrationDataError):
        obs.select(float("nan"))
    obs.observe(np.zeros(10, np.float32))                               # new data: back to KL
    assert obs.selected is None


# ----------------------------------------------------------------- render --
def test_render_symmetric_and_asymmetric_scales():
    x = np.linspace(-2.0, 3.0, 1001, dtype=np.float32)
    obs = observer("minmax")
    obs.observe(x)
    obs.render()
    cfg = obs.config
    assert float(cfg.scale) == pytest.approx(3.0 / 127.5, rel=1e-6) and int(cfg.offset) == 0
    assert cfg.state is QuantizationStates.INITIAL
    narrow = observer("minmax", quant_min=-127, quant_max=127)
    narrow.observe(x)
    narrow.render()
    assert float(narrow.config.scale) == pytest.approx(3.0 / 127, rel=1e-6)
    asym = observer("minmax", symmetric=False)
    asym.observe(x)
    asym.render()
    assert float(asym.config.scale) == pytest.approx(5.0 / 255, rel=1e-6)
    assert int(asym.config.offset) == round(2.0 / (5.0 / 255))
    np.testing.assert_allclose(asym.config.fake_quantize(x), x, atol=5.0 / 255)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_power_of_2_configs_get_power_of_2_scales(algorithm):
    rng = np.random.default_rng(12)
    obs = make_observer(config(algorithm, power_of_2=True))
    obs.observe(rng.normal(size=5000).astype(np.float32) * 3)
    obs.render()
    scale = float(obs.config.scale)
    assert scale == 2.0 ** round(np.log2(scale))
    assert scale * 127.5 >= float(np.max(np.abs(obs.thresholds())))


def test_render_per_channel_writes_one_scale_per_channel():
    rng = np.random.default_rng(13)
    w = (rng.normal(size=(6, 3, 3, 3)) * np.arange(1, 7)[:, None, None, None]).astype(np.float32)
    for algorithm in ("minmax", "percentile", "kl", "mse"):
        obs = make_observer(config(algorithm, per_channel=True, axis=0, name="conv.w"))
        obs.observe(w)
        obs.render()
        scale = obs.config.scale
        lo, hi = obs.thresholds()
        assert scale.shape == (6,)
        np.testing.assert_allclose(scale, np.maximum(-lo, hi) / 127.5, rtol=1e-6)


def test_kl_keeps_the_full_range_of_discrete_data():
    """Raw pixels take few distinct values: KL must not clip them to the first non-zero value."""
    from ppqlike.core.quant import QuantizationPolicy, QuantizationProperty as P, TensorQuantizationConfig
    from ppqlike.optim.observers import make_observer
    config = TensorQuantizationConfig(QuantizationPolicy(P.PER_TENSOR | P.LINEAR | P.SYMMETRICAL), num_of_bits=8,
                                      quant_min=-128, quant_max=127, observer_algorithm="kl", name="pixels")
    observer = make_observer(config)
    pixels = np.random.default_rng(0).integers(0, 17, size=(64, 1, 8, 8)).astype(np.float32) / 16 - 0.5
    observer.observe(pixels)
    low, high = observer.thresholds()
    assert float(high) == pytest.approx(0.5)


# ------------------------------------------------------------------ mean min-max (NNCF's MEAN_MINMAX)
@given(arrays=st.lists(hnp.arrays(np.float32, st.tuples(st.integers(1, 4), st.integers(1, 3), st.integers(1, 5)),
                                  elements=st.floats(-1e4, 1e4, width=32)), min_size=1, max_size=5),
       order=st.randoms(use_true_random=False))
@settings(max_examples=60, deadline=None)
def test_mean_minmax_is_the_exact_mean_of_per_sample_extremes_in_any_order(arrays, order):
    samples = [row for batch in arrays for row in batch]
    lows = np.array([row.min() for row in samples], np.float64)
    highs = np.array([row.max() for row in samples], np.float64)
    whole = observer("mean_minmax", symmetric=False)
    for batch in arrays:
        whole.observe(batch)
    lo, hi = whole.thresholds()
    assert lo == pytest.approx(float(np.mean(lows)), rel=1e-12, abs=1e-30)
    assert hi == pytest.approx(float(np.mean(highs)), rel=1e-12, abs=1e-30)
    shards = []
    for batch in arrays:
        shard = observer("mean_minmax", symmetric=False)
        shard.observe(batch)
        shards.append(shard)
    order.shuffle(shards)
    merged = observer("mean_minmax", symmetric=False)
    for shard in shards:
        merged.merge(shard)
    assert merged.thresholds() == (lo, hi)   # exact sums: the same bits in any order


def test_mean_minmax_reads_samples_from_a_channels_last_view():
    nhwc = np.random.default_rng(3).standard_normal((6, 5, 4, 3)).astype(np.float32)
    nchw = nhwc.transpose(0, 3, 1, 2)          # what the executor hands over: no copy is made
    seen = observer("mean_minmax", symmetric=False)
    seen.observe(nchw)
    lo, hi = seen.thresholds()
    assert lo == pytest.approx(nhwc.reshape(6, -1).min(axis=1).astype(np.float64).mean(), rel=1e-12)
    assert hi == pytest.approx(nhwc.reshape(6, -1).max(axis=1).astype(np.float64).mean(), rel=1e-12)
    shuffled = np.ascontiguousarray(nhwc.transpose(1, 0, 2, 3)).transpose(1, 0, 2, 3)   # batch axis not outermost
    other = observer("mean_minmax", symmetric=False)
    other.observe(shuffled)
    assert other.thresholds() == (lo, hi)
