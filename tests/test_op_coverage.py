"""No deterministic default-domain ONNX operator that onnxruntime runs on CPU is missing from the executor.

The list is computed at run time: every operator of ``onnx.defs.get_all_schemas_with_history()`` in the
default domain with a version up to opset 23 (196 with onnx 1.23), less the executor's kernels, less
the ops refused by name below (each with its reason, also the executor's error message), less the
control-flow ops that branch `control` of issue 35 adds (the recurrent ones came with branch
`recurrent`).  Whatever is left is missing, and the test fails naming it.

How the list was made (issue 35, item 3; onnx 1.23.2, onnxruntime 1.32.0): a single-node model per
operator at its newest opset up to 23 (and older ones where onnxruntime's kernel stops earlier), one
``InferenceSession`` on the CPU provider each.  onnxruntime ran all of them except ImageDecoder (no CPU
kernel), MaxRoiPool-22 and RoiAlign-22 (kernels up to 21, which the executor runs; the 22 versions only
add bfloat16), and Upsample/Scatter at opsets 11+ (deprecated: the model is invalid there).

Added for issue 35 (61 ops, one module per family under ppqlike/executor/ops/):
  trigonometry: Sin Cos Tan Asin Acos Atan Sinh Cosh Asinh Acosh Atanh
  bitwise: BitShift BitwiseAnd BitwiseOr BitwiseXor BitwiseNot
  algebra: Einsum Det CumSum Trilu
  selection: OneHot Compress ReverseSequence CenterCropPad Unique
  activation: Shrink
  normalization: GroupNormalization (18, 21) RMSNormalization LpNormalization MeanVarianceNormalization LRN
  signal: DFT (17, 20) STFT HannWindow HammingWindow BlackmanWindow MelWeightMatrix
  detection: NonMaxSuppression RoiAlign (10, 16) MaxRoiPool MaxUnpool
  sampling: GridSample (16, 20) AffineGrid Col2Im DeformConv
  attention: Attention RotaryEmbedding
  quantization: QuantizeLinear DequantizeLinear DynamicQuantizeLinear QLinearConv QLinearMatMul ConvInteger
                MatMulInteger
  loss: NegativeLogLikelihoodLoss SoftmaxCrossEntropyLoss
  text: StringConcat StringSplit RegexFullMatch StringNormalizer TfIdfVectorizer

Refused by name (REFUSED below): the random ops (RandomNormal, RandomNormalLike, RandomUniform,
RandomUniformLike, Multinomial, Bernoulli); ImageDecoder (no onnxruntime CPU kernel, image codecs);
Upsample and Scatter (deprecated before opset 11, the lowest ppqlike reads).  Each op's test module is
tests/test_ops_<family>.py.
"""

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import helper

import ppqlike
from ppqlike.core.errors import UnsupportedOperationError
from ppqlike.executor.ops import REFUSED_OP_TYPES, SUPPORTED_OP_TYPES
from onnx_helpers import IR_VERSION

NEWEST_OPSET = 23

#: op type -> why the executor refuses it (a word of the reason that its error must contain)
REFUSED = {
    "RandomNormal": "random", "RandomNormalLike": "random", "RandomUniform": "random",
    "RandomUniformLike": "random", "Multinomial": "random", "Bernoulli": "random",
    "ImageDecoder": "no CPU kernel",
    "Upsample": "deprecated", "Scatter": "deprecated",
}

def _default_domain_ops(newest: int = NEWEST_OPSET) -> set:
    return {schema.name for schema in onnx.defs.get_all_schemas_with_history()
            if schema.domain in ("", "ai.onnx") and schema.since_version <= newest}


def test_no_operator_is_missing():
    missing = _default_domain_ops() - SUPPORTED_OP_TYPES - set(REFUSED)
    assert not missing, f"default-domain ops up to opset {NEWEST_OPSET} the executor neither runs nor refuses: " \
                        f"{sorted(missing)}"


def test_the_refused_list_is_the_executors():
    assert set(REFUSED_OP_TYPES) == set(REFUSED)
    assert not set(REFUSED) & SUPPORTED_OP_TYPES
    assert set(REFUSED) <= _default_domain_ops()


@pytest.mark.parametrize("op_type", sorted(REFUSED))
def test_refused_ops_say_why(op_type):
    graph = ppqlike.Graph(opset=21)
    x = graph.create_variable("x", shape=[2, 3], dtype=np.float32)
    y = graph.create_variable("y")
    graph.inputs.append(x)
    graph.outputs.append(y)
    graph.create_operation(op_type, [x], [y])
    with pytest.raises(UnsupportedOperationError, match=REFUSED[op_type]) as error:
        ppqlike.NumpyExecutor(graph).forward({"x": np.zeros((2, 3), np.float32)})
    assert op_type in str(error.value)


def test_image_decoder_has_no_onnxruntime_cpu_kernel():
    """The reason ImageDecoder is refused, checked against the installed onnxruntime."""
    node = helper.make_node("ImageDecoder", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.UINT8, [100])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.UINT8, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = IR_VERSION
    with pytest.raises(Exception, match="NOT_IMPLEMENTED|implementation"):
        onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("op_type", ["Upsample", "Scatter"])
def test_deprecated_ops_are_invalid_from_opset_11(op_type):
    """The reason Upsample and Scatter are refused: onnx knows no valid form of them at opsets 11-23."""
    for opset in range(11, NEWEST_OPSET + 1):
        assert onnx.defs.get_schema(op_type, opset).deprecated
