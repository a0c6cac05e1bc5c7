"""Issue 33, item 5(b): activations written out as several ops (HardSwish as Add -> Clip -> Mul -> Div, SiLU as
Sigmoid -> Mul, Mish as Softplus -> Tanh -> Mul) are one block, found by what they compute, and every platform
treats the block as it treats a GELU: no quantization inside it.  Quantized op by op, a written-out HardSwish
rounds four times where a runtime rounds once (PicoDet's layout detector: ORT_INT8 output cosine 0.94 op by op,
0.977 as blocks)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx_helpers import make_model, run_executor, run_onnxruntime
from ppqlike import api
from ppqlike.core.patterns import find_transformer_blocks
from ppqlike.core.quant_graph import governing_config
from ppqlike.export import build_qdq_model
from ppqlike.io.load import load_graph
from ppqlike.optim.passes.calibration import terminal_tensors
from ppqlike.optim.setting import QuantizationSettingFactory
from ppqlike.platforms.policies import PLATFORM_POLICIES
from ppqlike.platforms.target import TargetPlatform

CHANNELS = 8
RNG = np.random.default_rng(7)
WEIGHTS = {"w1": RNG.standard_normal((CHANNELS, 3, 3, 3)) * 0.4, "b1": RNG.standard_normal(CHANNELS) * 0.2,
           "w2": RNG.standard_normal((CHANNELS, CHANNELS, 3, 3)) * 0.2, "b2": RNG.standard_normal(CHANNELS) * 0.1}
CALIB = [RNG.standard_normal((4, 3, 12, 12)).astype(np.float32) for _ in range(2)]
TEST = RNG.standard_normal((16, 3, 12, 12)).astype(np.float32)


def _spelling(name: str) -> tuple[list, dict]:
    """Nodes computing ``a`` = activation(``h``) and their constants."""
    node = helper.make_node
    if name == "hard_swish_div":       # PaddlePaddle's and torch.onnx's spelling before opset 14
        return [node("Add", ["h", "three"], ["t"]), node("Clip", ["t", "zero", "six"], ["r"]),
                node("Mul", ["h", "r"], ["m"]), node("Div", ["m", "six"], ["a"])], {"three": 3, "zero": 0, "six": 6}
    if name == "hard_swish_scaled":    # the 1/6 first, then the product
        return [node("Add", ["h", "three"], ["t"]), node("Clip", ["t", "zero", "six"], ["r"]),
                node("Mul", ["r", "sixth"], ["g"]), node("Mul", ["g", "h"], ["a"])],\
            {"three": 3, "zero": 0, "six": 6, "sixth": 1 / 6}
    if name == "hard_swish_hard_sigmoid":
        return [node("HardSigmoid", ["h"], ["g"], alpha=1 / 6, beta=0.5), node("Mul", ["h", "g"], ["a"])], {}
    if name == "silu":
        return [node("Sigmoid", ["h"], ["g"]), node("Mul", ["h", "g"], ["a"])], {}
    if name == "mish":
        return [node("Softplus", ["h"], ["p"]), node("Tanh", ["p"], ["t"]), node("Mul", ["h", "t"], ["a"])], {}
    if name == "mish_exp_log":
        return [node("Exp", ["h"], ["e"]), node("Add", ["e", "one"], ["e1"]), node("Log", ["e1"], ["p"]),
                node("Tanh", ["p"], ["t"]), node("Mul", ["t", "h"], ["a"])], {"one": 1}
    if name == "hard_swish_op":
        return [node("HardSwish", ["h"], ["a"])], {}
    raise KeyError(name)


#: spelling -> (ops in the block, form)
SPELLINGS = {"hard_swish_div": (4, "hard_swish"), "hard_swish_scaled": (4, "hard_swish"),
             "hard_swish_hard_sigmoid": (2, "hard_swish"), "silu": (2, "silu"), "mish": (3, "mish"),
             "mish_exp_log": (5, "mish")}


def _model(spelling: str, layers: int = 2):
    """Conv -> activation -> Conv on NCHW images (opset 14: HardSwish exists); with ``layers`` 3, one more Conv
    (the second one's weights again) after the second."""
    nodes, constants = _spelling(spelling)
    tail = [helper.make_node("Conv", ["a", "w2", "b2"], ["y"], pads=[1, 1, 1, 1])] if layers == 2 else \
        [helper.make_node("Conv", ["a", "w2", "b2"], ["z"], pads=[1, 1, 1, 1]),
         helper.make_node("Conv", ["z", "w2", "b2"], ["y"], pads=[1, 1, 1, 1])]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["h"], pads=[1, 1, 1, 1]), *nodes, *tail]
    initializers = [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in {**WEIGHTS, **constants}.items()]
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 12, 12])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", CHANNELS, 12, 12])],
                      initializers, opset=14)


@pytest.mark.parametrize("spelling", list(SPELLINGS))
def test_every_spelling_is_one_activation_block(spelling):
    model = _model(spelling)
    np.testing.assert_allclose(run_executor(model, {"x": TEST})[0], run_onnxruntime(model, {"x": TEST})[0],
                               rtol=1e-4, atol=1e-4)
    graph = load_graph(model)
    (block,) = [b for b in find_transformer_blocks(graph) if b.kind == "Activation"]
    assert (len(block.operations), block.form) == SPELLINGS[spelling]
    assert block.source == "h" and block.result == "a" and graph.variables["a"].producer.name == block.tail


@pytest.mark.parametrize("nodes,constants", [
    # 6 x HardSwish: the /6 left out
    ([helper.make_node("Add", ["h", "three"], ["t"]), helper.make_node("Clip", ["t", "zero", "six"], ["r"]),
      helper.make_node("Mul", ["h", "r"], ["a"])], {"three": 3, "zero": 0, "six": 6}),
    # Swish with beta 2: x * sigmoid(2x)
    ([helper.make_node("Mul", ["h", "two"], ["h2"]), helper.make_node("Sigmoid", ["h2"], ["g"]),
      helper.make_node("Mul", ["h", "g"], ["a"])], {"two": 2}),
    # HardSigmoid written out reads its source once: an op chain, no block
    ([helper.make_node("Add", ["h", "three"], ["t"]), helper.make_node("Clip", ["t", "zero", "six"], ["r"]),
      helper.make_node("Div", ["r", "six"], ["a"])], {"three": 3, "zero": 0, "six": 6}),
])
def test_what_computes_something_else_is_no_block(nodes, constants):
    initializers = [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in constants.items()]
    model = make_model(nodes, [helper.make_tensor_value_info("h", TensorProto.FLOAT, [2, 8])],
                       [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 8])], initializers)
    assert [b for b in find_transformer_blocks(load_graph(model)) if b.kind == "Activation"] == []


@pytest.mark.parametrize("platform", ["ORT_INT8", "TRT_INT8", "TPU_INT8", "DSP_INT8"])
def test_no_config_inside_an_activation_block(platform):
    """The platform's GELU treatment applies: a float block has no config at all, a quantized one only its result's."""
    policy = PLATFORM_POLICIES[TargetPlatform.parse(platform)].transformer
    setting = QuantizationSettingFactory.for_platform(platform)
    setting.recipe = "plain"
    for spelling in ("hard_swish_div", "silu", "mish"):
        graph = api.quantize_onnx_model(_model(spelling), CALIB, platform=platform, setting=setting)
        (block,) = [b for b in find_transformer_blocks(graph) if b.kind == "Activation"]
        assert all(graph.operations[name].config is None for name in block.operations[:-1]), (spelling, block)
        tail = graph.operations[block.tail].config
        if policy.treatment("Activation") == "float" or platform == "TRT_INT8":   # TensorRT: float by placement
            assert tail is None or not any(governing_config(c) for c in tail.output_quantization_config)
        else:
            assert not any(governing_config(c) for c in tail.input_quantization_config), (spelling, block)
            assert all(governing_config(c) for c in tail.output_quantization_config), (spelling, block)


def _worst_cosine(model, platform: str) -> float:
    setting = QuantizationSettingFactory.for_platform(platform)
    setting.recipe = "plain"
    graph = api.quantize_onnx_model(model, CALIB, platform=platform, setting=setting)
    exported, _ = build_qdq_model(graph)
    want, got = run_onnxruntime(model, {"x": TEST})[0], run_onnxruntime(exported, {"x": TEST})[0]
    want, got = want.reshape(len(want), -1), got.reshape(len(got), -1)
    return float(((want * got).sum(1) / np.linalg.norm(want, axis=1) / np.linalg.norm(got, axis=1)).min())


@pytest.mark.parametrize("platform", ["ORT_INT8", "TPU_INT8"])
def test_written_out_hard_swish_quantizes_as_the_hard_swish_op(platform):
    """Exported and run in onnxruntime, every spelling of HardSwish keeps the HardSwish op's model's worst cosine
    with FP32, within 5e-5: one function between the same two quantizers, whatever its ops (quantized op by op,
    TPU_INT8's Add -> Clip -> Mul -> Div spelling lost 3.5e-4 on this model; PicoDet's detector 0.04 of output
    cosine)."""
    reference = _worst_cosine(_model("hard_swish_op"), platform)
    spelled = {name: _worst_cosine(_model(name), platform)
               for name in ("hard_swish_div", "hard_swish_scaled", "hard_swish_hard_sigmoid")}
    assert reference >= 0.99 and all(abs(value - reference) <= 5e-5 for value in spelled.values()), \
        (spelled, reference)


def test_two_blocks_side_by_side_are_two_blocks():
    """Two HardSwish blocks reading the same constants: two blocks, each op in one of them."""
    nodes, constants = _spelling("hard_swish_div")
    renamed = [helper.make_node(n.op_type, [f"{i}2" if i in ("h", "t", "r", "m", "a") else i for i in n.input],
                                [f"{o}2" for o in n.output]) for n in nodes]
    model = make_model(
        [*nodes, *renamed],
        [helper.make_tensor_value_info("h", TensorProto.FLOAT, [2, 8]),
         helper.make_tensor_value_info("h2", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 8]),
         helper.make_tensor_value_info("a2", TensorProto.FLOAT, [2, 8])],
        [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in constants.items()])
    blocks = find_transformer_blocks(load_graph(model))
    assert Counter(b.kind for b in blocks) == {"Activation": 2}
    assert max(Counter(name for b in blocks for name in b.operations).values()) == 1


@pytest.mark.parametrize("platform", ["ORT_INT8", "TPU_INT8"])
@pytest.mark.parametrize("spelling", ["hard_swish_div", "silu"])
def test_an_activation_blocks_input_is_not_terminal_and_its_range_is_chosen_apart(platform, spelling):
    """The Conv output a written-out activation reads is read by the block's float ops only, yet the next Conv
    reads what the block computes from it: it is not terminal (terminal tensors take min-max in balanced) but
    read through float ops, and the observer choice tries min-max on it apart, keeping it only where the
    output error falls (``read_through_float`` in the calibration report)."""
    model = _model(spelling, layers=3)   # balanced keeps the op writing the output in float
    graph = api.quantize_onnx_model(model, CALIB, platform=platform)
    terminal, read_through_float = terminal_tensors(graph)
    assert "y" in terminal and "h" not in terminal and "h" in read_through_float   # (and the block's inner tensors)
    assert "a" not in terminal | read_through_float   # the next Conv reads it quantized
    report = next(p["report"] for p in graph.metadata["quantization"]["passes"] if p["name"] == "calibration")
    chosen, apart = report["observer_chosen"], report.get("read_through_float")
    conv = next(op for op in graph.operations.values() if op.outputs[0].name == "h")
    config = conv.config.output_quantization_config[0]
    assert config.observer_algorithm == "auto"
    if chosen == "minmax":   # nothing to try apart
        assert apart is None
        return
    assert apart["tensors"] == 1
    assert apart["kept"] == ("minmax" if apart["minmax_error"] < report["observer_errors"][chosen] else chosen)
    if apart["kept"] == "minmax":   # the whole calibration range of h, unclipped
        h = run_executor(model, {"x": np.concatenate(CALIB)}, output_names=["h"])[0]
        top = (config.quant_max - float(config.offset)) * float(config.scale)
        assert top >= h.max() - float(config.scale)
