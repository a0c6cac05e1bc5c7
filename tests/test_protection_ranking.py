"""Which units the protection measures alone (optim/passes/protection.py, ``LayerProtectionPass._ranked``).

Measuring every unit alone costs a partial forward each, so the protection measures the few that two cheap
rankings put first: the local error (a narrow channel on a shared per-tensor grid, at the unit's own
results) and the error at the unit's readers (the same noise after the reading op's weights).  The model
holds a decoy and the real damage, as PicoDet's backbone does: a unit whose results have six narrow
channels that the next conv multiplies by almost nothing (local error high, harmless), and a unit whose
results have one narrow channel that a depthwise conv multiplies by 300 (local error low, wrecks the output).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from ppqlike import api
from ppqlike.core.quant import QuantizationStates
from ppqlike.executor import NumpyExecutor
from ppqlike.optim.passes.precision_moves import find_units
from ppqlike.optim.passes.protection import LayerProtectionPass
from ppqlike.optim.passes.sensitivity import AloneRunner, output_cosine, tensor_relative_error
from ppqlike.optim.setting import QuantizationSettingFactory

from onnx_helpers import make_model

CHANNELS = 8


def _model(seed: int = 5):
    """x -> conv_a (channel 0 narrow) -> relu -> depthwise (channel 0 times 300) -> relu -> conv_b (channels
    2..7 narrow) -> relu -> conv_c (channels 2..7 read with weight 1e-4) -> GAP -> flatten -> gemm -> y."""
    generator = np.random.default_rng(seed)
    narrow_first = np.ones(CHANNELS)
    narrow_first[0] = 1 / 300
    narrow_rest = np.full(CHANNELS, 1 / 300)
    narrow_rest[:2] = 1.0
    reads = np.full(CHANNELS, 1e-4)
    reads[:2] = 1.0
    emphasis = np.ones(CHANNELS)
    emphasis[0] = 3.0   # the depthwise channel 0 carries most of what conv_b reads
    tensors = {
        "wa": generator.standard_normal((CHANNELS, 3, 3, 3)) * narrow_first[:, None, None, None],
        "ba": np.abs(generator.standard_normal(CHANNELS)) * narrow_first,
        "wd": generator.standard_normal((CHANNELS, 1, 3, 3)) * 0.3 * (emphasis / narrow_first)[:, None, None, None],
        "bd": np.zeros(CHANNELS),
        "wb": generator.standard_normal((CHANNELS, CHANNELS, 1, 1)) * 0.3 * narrow_rest[:, None, None, None],
        "bb": np.abs(generator.standard_normal(CHANNELS)) * narrow_rest,
        "wc": generator.standard_normal((16, CHANNELS, 1, 1)) * 0.3 * reads[None, :, None, None],
        "bc": np.zeros(16), "wg": generator.standard_normal((10, 16)) * 0.3, "bg": np.zeros(10)}
    nodes = [helper.make_node("Conv", ["x", "wa", "ba"], ["a"], name="conv_a", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["ra"], name="relu_a"),
             helper.make_node("Conv", ["ra", "wd", "bd"], ["d"], name="conv_depthwise", pads=[1, 1, 1, 1],
                              group=CHANNELS),
             helper.make_node("Relu", ["d"], ["rd"], name="relu_depthwise"),
             helper.make_node("Conv", ["rd", "wb", "bb"], ["b"], name="conv_b"),
             helper.make_node("Relu", ["b"], ["rb"], name="relu_b"),
             helper.make_node("Conv", ["rb", "wc", "bc"], ["c"], name="conv_c"),
             helper.make_node("GlobalAveragePool", ["c"], ["g"], name="pool"),
             helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "wg", "bg"], ["y"], name="head", transB=1)]
    return make_model(nodes, [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 3, 16, 16])],
                      [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 10])],
                      [numpy_helper.from_array(v.astype(np.float32), k) for k, v in tensors.items()])


def _data(batches: int = 5, seed: int = 0) -> list[np.ndarray]:
    generator = np.random.default_rng(seed)
    return [generator.standard_normal((16, 3, 16, 16)).astype(np.float32) for _ in range(batches)]


@pytest.mark.parametrize("platform", ["TRT_INT8", "TPU_INT8"])
def test_the_readers_ranking_finds_what_the_local_one_misses(platform):
    setting = QuantizationSettingFactory.for_platform(platform)
    setting.recipe, setting.protection = "plain", False
    graph = api.quantize_onnx_model(_model(), _data(), platform=platform, setting=setting)
    runner = AloneRunner(graph, NumpyExecutor(graph))
    cached = runner.cache(_data(1, seed=1)[0])
    units = find_units(graph)
    unit_of = {op.name: unit for unit in units for op in unit}
    real, decoy = unit_of["relu_a"], unit_of["relu_b"]
    assert runner.local_error(decoy, cached) > runner.local_error(real, cached)      # the decoy looks worse
    assert runner.reader_error(real, cached) > runner.reader_error(decoy, cached)    # where it is read, it is not
    reference = [cached["y"]]
    alone = {name: 1 - output_cosine(runner.quantize_alone(unit, cached), reference)
             for name, unit in (("real", real), ("decoy", decoy))}
    assert alone["real"] > 2 * alone["decoy"], alone
    local_first = sorted(units, key=lambda unit: -runner.local_error(unit, cached))[0]
    assert local_first is decoy   # one unit measured by the local ranking alone would be the harmless one
    measured = [units[index] for index in LayerProtectionPass(measured_units=1)._ranked(runner, units, [(cached, None)])]
    assert measured[0] is decoy and real in measured


@pytest.mark.parametrize("platform", ["TRT_INT8", "TPU_INT8"])
def test_the_protection_moves_the_real_damage_not_the_decoy(platform):
    graph = api.quantize_onnx_model(_model(), _data(), platform=platform)   # balanced
    report = next(p["report"] for p in graph.metadata["quantization"]["passes"] if p["name"] == "protection")
    moved = {name for entry in report["protected"] for name in entry["ops"]}
    assert moved & {"conv_a", "relu_a"} and not moved & {"conv_b", "relu_b"}, report
    assert report["final_error"] < 0.1 * report["initial_error"], report
    assert graph.metadata["quantization"]["verdict"]["ok"]


@pytest.mark.parametrize("value,reference,expected", [
    ([1.0, 2.0], [1.0, 2.0], 0.0),
    ([1.0, 0.0], [1.0, 2.0], 4.0 / 5.0),
    ([3.0, 0.0], [0.0, 0.0], 1.0),          # a zero reference matched by nothing: as far as it gets
    ([0.0, 0.0], [0.0, 0.0], 0.0),
    ([10.0, 10.0], [1.0, 0.0], 1.0),        # at most 1
    ([np.nan, 0.0], [1.0, 0.0], 1.0),       # not finite: as far as it gets
])
def test_tensor_relative_error_exact(value, reference, expected):
    got = tensor_relative_error(np.array(value, np.float32), np.array(reference, np.float32))
    assert got == pytest.approx(expected, abs=1e-7)


def test_tensor_relative_error_skips_what_is_not_a_float_tensor_of_its_shape():
    assert tensor_relative_error(np.ones(3), np.ones(4)) == 0.0
    assert tensor_relative_error(np.ones(3, np.int64), np.zeros(3, np.int64)) == 0.0


def _moved_units(units) -> int:
    """How many of ``units`` run in float (every config of every op FP32)."""
    return sum(all(config is None or config.state is QuantizationStates.FP32 for op in unit
                   for config in [*op.config.input_quantization_config, *op.config.output_quantization_config])
               for unit in units)


@pytest.mark.parametrize("errors,front_units,front_floor", [
    ({0: 0.2, 1: 0.15, 2: 0.08, 4: 0.03, 8: 0.02}, 4, None),    # 2 halves it, 4 halves that again, 8 does not
    ({0: 0.2, 1: 0.05, 2: 0.004, 4: 0.001, 8: 0.0}, 2, None),   # 2 is below front_floor: no wider move
    ({0: 0.2, 1: 0.15, 2: 0.12, 4: 0.11, 8: 0.105}, None, None),  # nothing halves it
    ({0: 0.01, 2: 0.004, 4: 0.0015, 8: 0.0}, 2, 0.005),   # balanced's floor: the first layer's 0.004 is under it
    ({0: 0.01, 2: 0.004, 4: 0.0015, 8: 0.0}, 4, 0.002),   # best's: 0.004 is not, and 2 layers halve it
    ({0: 0.2, 1: 0.01, 2: 0.15, 4: 0.12, 8: 0.11}, None, None),   # a Conv without its Relu is never a front
    # 9 units: under WIDE_FRONT_ERROR (0.005) a front spans at most half of them (4)
    ({0: 0.004, 1: 0.0038, 2: 0.0035, 4: 0.003, 8: 0.0}, None, 0.002),
    ({0: 0.008, 1: 0.0078, 2: 0.0075, 4: 0.003, 8: 0.0012}, 4, 0.002),   # from 0.008: 4, not widened under 0.005
])
def test_the_front_widens_while_it_halves_the_error(errors, front_units, front_floor):
    """Fronts of 1, 2, 4, 8 units taken on to their layer's end (Conv, Relu, Conv, Relu, ...: 2, 4, 8)."""
    setting = QuantizationSettingFactory.for_platform("TRT_INT8")
    setting.recipe, setting.protection = "plain", False
    graph = api.quantize_onnx_model(_model(), _data(), platform="TRT_INT8", setting=setting)
    units = find_units(graph)
    assert len(units) > 8 and _moved_units(units) == 0

    def error() -> float:   # the error as a function of how many leading units run in float
        moved = _moved_units(units)
        return errors[max(size for size in errors if size <= moved)]

    protection = LayerProtectionPass(float_boundaries=True, front_floor=front_floor)
    front = protection._protect_front(graph, units, {}, error, errors[0])
    if front_units is None:
        assert front is None and _moved_units(units) == 0
        return
    assert front["front_units"] == front_units and front["error_after"] == pytest.approx(errors[front_units])
    assert _moved_units(units) >= front_units


@pytest.mark.parametrize("float_fronts", [False, True])
def test_a_front_goes_straight_to_fp32_where_the_wider_grid_runs_in_float_kernels(float_fronts):
    """onnxruntime's CPU computes int16 QDQ layers with float kernels between Q/DQ pairs: a front there is
    tried in FP32 only (as exact, and faster deployed); elsewhere the wider grid first."""
    setting = QuantizationSettingFactory.for_platform("ORT_INT8")
    setting.recipe, setting.protection = "plain", False
    graph = api.quantize_onnx_model(_model(), _data(), platform="ORT_INT8", setting=setting)
    units = find_units(graph)
    trials = []

    def error() -> float:   # 0.2 until the first unit runs in float (an INT16 move leaves every unit integer)
        trials.append(_moved_units(units))
        return 0.2 if _moved_units(units) == 0 else 0.01

    protection = LayerProtectionPass(higher_precision_bits=16, float_fronts=float_fronts)
    front = protection._protect_front(graph, units, {}, error, 0.2)
    assert front["front_units"] == 1 and front["precision"] == "FP32"
    # sizes 1 and 2 (no further halving): each tried in FP32 only, or first on the 16-bit grid (nothing in float)
    assert len(trials) == (2 if float_fronts else 4) and (0 in trials) is not float_fronts


def test_onnxruntime_fronts_are_float_and_the_integer_runtimes_keep_their_wider_grid():
    from ppqlike.optim.recipe import apply_recipe, build_pipeline, resolve_policy
    for platform, float_fronts in (("ORT_INT8", True), ("DSP_INT8", False), ("TIDL_INT8", False)):
        setting, _ = apply_recipe(QuantizationSettingFactory.for_platform(platform), platform)
        protection = next(p for p in build_pipeline(resolve_policy(platform, setting), setting).passes
                          if p.name == "protection")
        assert protection.float_fronts is float_fronts, platform
