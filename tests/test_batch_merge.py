"""Calibration data given a sample at a time runs as larger batches, only where a sample's results cannot change."""

import numpy as np
from hypothesis import given, settings, strategies as st
from onnx import TensorProto, helper, numpy_helper

import ppqlike
from ppqlike.api import quantize_onnx_model
from ppqlike.executor import NumpyExecutor
from ppqlike.optim.batch_merge import MERGED_SAMPLES, batch_axis_is_free, merge_small_batches
from test_passes import small_model


def _model(input_shape, reshape_to=None):
    """x -> Conv -> Relu -> (Reshape to ``reshape_to`` | GlobalAveragePool -> Flatten) -> y."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu")]
    inits = [weight]
    if reshape_to is not None:
        inits.append(numpy_helper.from_array(np.array(reshape_to, np.int64), "shape"))
        nodes.append(helper.make_node("Reshape", ["r", "shape"], ["y"], name="reshape"))
    else:
        nodes += [helper.make_node("GlobalAveragePool", ["r"], ["g"], name="gap"),
                  helper.make_node("Flatten", ["g"], ["y"], name="flatten")]
    graph = helper.make_graph(nodes, "merge", [helper.make_tensor_value_info("x", TensorProto.FLOAT, input_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _samples(count, shape=(3, 8, 8), per_batch=1, seed=0):
    data = np.random.default_rng(seed).standard_normal((count, *shape)).astype(np.float32)
    return [data[i:i + per_batch] for i in range(0, count, per_batch)]


def _setting():
    setting = ppqlike.QuantizationSettingFactory.for_platform("ORT_INT8")
    setting.recipe, setting.activation_observer = "plain", "minmax"
    return setting


def _scales(graph):
    return [(op.name, index, None if c.scale is None else np.asarray(c.scale).tolist(),
             None if c.offset is None else np.asarray(c.offset).tolist())
            for op in graph.operations.values() if op.config is not None
            for index, c in enumerate(op.config.all_configs())]


def test_single_samples_calibrate_as_the_same_samples_in_batches_of_sixteen():
    singles = _samples(32)   # 8 of them held aside (16 samples or a quarter of the batches); 24 calibrate
    merged = quantize_onnx_model(small_model(), singles, platform="ORT_INT8", setting=_setting())
    batched = [np.concatenate(singles[0:8]), np.concatenate(singles[8:24])]   # two batches: none held aside
    plain = quantize_onnx_model(small_model(), batched, platform="ORT_INT8", setting=_setting())
    assert merged.metadata["quantization"]["merged_batches"] == {"batches": 24, "merged_into": 2,
                                                                  "samples_per_batch": 16, "held_aside": 8,
                                                                  "held_aside_merged_into": 1}
    assert plain.metadata["quantization"]["merged_batches"] is None
    assert _scales(merged) == _scales(plain)
    assert merged.metadata["quantization"]["verdict"]["samples"] == 8   # measured on the 8 held aside


def test_the_short_group_comes_first_and_the_held_aside_batches_are_merged_apart():
    graph = ppqlike.load_onnx_graph(small_model())
    singles = [{"x": batch} for batch in _samples(44)]
    merged, facts = merge_small_batches(graph, NumpyExecutor(graph), singles, singles, None, 4)
    assert [len(batch["x"]) for batch in merged] == [8, 16, 16, 4] and facts["merged_into"] == 3
    np.testing.assert_array_equal(np.concatenate([b["x"] for b in merged]), np.concatenate([b["x"] for b in singles]))


@settings(max_examples=25, deadline=None)
@given(count=st.integers(2, 70), per_batch=st.integers(1, 8))
def test_merging_keeps_every_sample_in_order_and_fills_all_but_the_first_batch(count, per_batch):
    graph = ppqlike.load_onnx_graph(small_model())
    batches = [{"x": batch} for batch in _samples(count * per_batch, per_batch=per_batch, seed=count)]
    held = count // 4
    result = merge_small_batches(graph, NumpyExecutor(graph), batches, batches, None, held)
    if 2 * per_batch > MERGED_SAMPLES or count - held < 2:
        assert result is None
        return
    merged, facts = result
    group = (MERGED_SAMPLES // per_batch) * per_batch
    sizes = [len(batch["x"]) for batch in merged]
    calibration, kept = sizes[:facts["merged_into"]], sizes[facts["merged_into"]:]
    assert all(size == group for size in calibration[1:]) and 0 < calibration[0] <= group
    assert all(size == group for size in kept[1:]) and (not held or 0 < kept[0] <= group)
    assert sum(calibration) == (count - held) * per_batch and sum(kept) == held * per_batch
    np.testing.assert_array_equal(np.concatenate([b["x"] for b in merged]),
                                  np.concatenate([b["x"] for b in batches]))
    assert facts == {"batches": count - held, "merged_into": len(calibration), "samples_per_batch": group,
                     "held_aside": held, "held_aside_merged_into": len(kept)}


def test_declared_batch_axis_decides():
    assert batch_axis_is_free(ppqlike.load_onnx_graph(_model(["N", 3, 8, 8])))
    assert not batch_axis_is_free(ppqlike.load_onnx_graph(_model([1, 3, 8, 8])))        # a fixed batch of 1
    assert not batch_axis_is_free(ppqlike.load_onnx_graph(_model(["T", "B", 8, 8])))    # which axis is the batch?
    assert not batch_axis_is_free(ppqlike.load_onnx_graph(_model(["N", 3, "H", "W"])))  # samples may differ


def test_a_fixed_batch_or_a_reshape_that_mixes_samples_is_left_alone():
    fixed = quantize_onnx_model(_model([1, 3, 8, 8]), _samples(8), platform="ORT_INT8", setting=_setting())
    assert fixed.metadata["quantization"]["merged_batches"] is None
    # declared a free batch axis, but its Reshape writes every sample into one row: merged, the outputs change
    mixing = _model(["N", 3, 8, 8], reshape_to=[1, -1])
    graph = quantize_onnx_model(mixing, _samples(8), platform="ORT_INT8", setting=_setting())
    assert graph.metadata["quantization"]["merged_batches"] is None
    refusing = _model(["N", 3, 8, 8], reshape_to=[1, 256])   # a batch of 2 cannot run at all: left alone too
    graph = quantize_onnx_model(refusing, _samples(8), platform="ORT_INT8", setting=_setting())
    assert graph.metadata["quantization"]["merged_batches"] is None
    per_sample = _model(["N", 3, 8, 8], reshape_to=[-1, 256])   # one row per sample: merged
    graph = quantize_onnx_model(per_sample, _samples(8), platform="ORT_INT8", setting=_setting())
    assert graph.metadata["quantization"]["merged_batches"]["merged_into"] == 1   # 6 calibrate, 2 held aside


def test_an_output_of_data_dependent_shape_is_left_alone():
    """[1, rank, count] of NonZero: the samples' counts differ, so their outputs do not even stack."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"), helper.make_node("NonZero", ["r"], ["n"], name="nz"),
             helper.make_node("Unsqueeze", ["n", "axes"], ["y"], name="unsqueeze")]
    weight = numpy_helper.from_array((np.random.default_rng(0).standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32),
                                     "w")
    model = helper.make_model(helper.make_graph(
        nodes, "nonzero", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [1, 4, None])],
        [weight, numpy_helper.from_array(np.array([0], np.int64), "axes")]),
        opset_imports=[helper.make_opsetid("", 13)])
    graph = ppqlike.load_onnx_graph(model)
    singles = [{"x": batch + 0.5 * index} for index, batch in enumerate(_samples(8))]   # different counts
    assert merge_small_batches(graph, NumpyExecutor(graph), singles, singles, None, 2) is None


def test_data_that_is_not_an_even_in_memory_list_is_left_alone():
    graph = ppqlike.load_onnx_graph(small_model())
    executor = NumpyExecutor(graph)
    singles = [{"x": batch} for batch in _samples(8)]
    assert merge_small_batches(graph, executor, iter(singles), singles, None, 2) is None   # a generator
    assert merge_small_batches(graph, executor, singles, singles, 4, 1) is None                # calib_steps
    uneven = singles[:7] + [{"x": np.concatenate([singles[7]["x"]] * 2)}]
    assert merge_small_batches(graph, executor, uneven, uneven, None, 2) is None               # 1, ..., 1, 2
    wide = singles[:4] + [{"x": np.zeros((1, 3, 8, 12), np.float32)}]
    assert merge_small_batches(graph, executor, wide, wide, None, 1) is None                   # another shape
    three = quantize_onnx_model(small_model(), _samples(3), platform="ORT_INT8", setting=_setting())
    assert three.metadata["quantization"]["merged_batches"] is None   # none held aside: too few to gain


class _Loader:
    """What a torch DataLoader with batch_size=1 looks like to ppqlike: sized, read again on each pass."""

    def __init__(self, samples, batch_size=1):
        self.samples, self.batch_size, self.passes = samples, batch_size, 0

    def __len__(self):
        return len(self.samples)

    def __iter__(self):
        self.passes += 1
        return iter(self.samples)


def test_a_sized_loader_of_single_samples_is_read_once_and_calibrates_as_the_list():
    singles = _samples(32)
    loader = _Loader(singles)
    from_loader = quantize_onnx_model(small_model(), loader, platform="ORT_INT8", setting=_setting())
    from_list = quantize_onnx_model(small_model(), singles, platform="ORT_INT8", setting=_setting())
    assert loader.passes == 1   # read into memory once; every pass after that runs the merged batches
    assert from_loader.metadata["quantization"]["merged_batches"] == \
        from_list.metadata["quantization"]["merged_batches"] == {"batches": 24, "merged_into": 2,
                                                                 "samples_per_batch": 16, "held_aside": 8,
                                                                 "held_aside_merged_into": 1}
    assert _scales(from_loader) == _scales(from_list)


def test_a_loader_too_large_to_hold_or_with_its_own_shards_is_left_alone(monkeypatch):
    import ppqlike.optim.batch_merge as batch_merge
    graph = ppqlike.load_onnx_graph(small_model())
    executor = NumpyExecutor(graph)
    singles = [{"x": batch} for batch in _samples(8)]
    monkeypatch.setattr(batch_merge, "MATERIALIZED_BYTES", 5 * singles[0]["x"].nbytes)   # 5 of the 8 samples
    loader = _Loader(singles)
    assert merge_small_batches(graph, executor, loader, loader, None, 2) is None
    assert loader.passes == 1   # stopped at the first batch: 8 of its size would not fit
    monkeypatch.setattr(batch_merge, "MATERIALIZED_BYTES", 8 * singles[0]["x"].nbytes)
    assert merge_small_batches(graph, executor, _Loader(singles), _Loader(singles), None, 2) is not None
    sharded = _Loader(singles)
    sharded.calibration_shard = lambda start, stop: None   # a CalibrationFolder: its files go to Ray's workers
    assert merge_small_batches(graph, executor, sharded, sharded, None, 2) is None
    assert sharded.passes == 0
    lying = type("Lying", (_Loader,), {"__len__": lambda self: 9})(singles)   # says 9, gives 8
    assert merge_small_batches(graph, executor, lying, lying, None, 2) is None


def test_a_loader_is_not_read_ahead_unless_its_batch_size_says_it_merges():
    graph = ppqlike.load_onnx_graph(small_model())
    singles = [{"x": batch} for batch in _samples(8)]
    batches = [{"x": batch} for batch in _samples(64, per_batch=16)]
    for loader in (_Loader(batches, batch_size=16), _Loader(singles, batch_size=None),
                   _Loader(singles, batch_size=True)):
        assert merge_small_batches(graph, NumpyExecutor(graph), loader, loader, None, 1) is None
        assert loader.passes == 0   # a lazy loader (JPEGs decoded on demand) is read once, by calibration
    declared = _Loader(singles, batch_size=1)
    assert merge_small_batches(graph, NumpyExecutor(graph), declared, declared, None, 1) is not None
    assert declared.passes == 1
