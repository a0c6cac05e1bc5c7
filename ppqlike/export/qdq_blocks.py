"""Block-quantized weights in ONNX (weight-only W4A16 / W8A16, ``ppqlike.core.quant_block``).

Two ways, both computing the simulation's dequantized weights bit for bit (float(q - Z) * S per block):

* ``qdq``: the codes as an int4/uint4 (int8/uint8 for 8 bits) initializer read by an opset-21
  DequantizeLinear with ``axis`` = the block axis and ``block_size``; scales (float32) and zero points
  shaped like the weight with the block axis cut to its block count (symmetric blocks write no zero point:
  it is 0).
* ``matmulnbits``: each such DequantizeLinear read only by the B input of a MatMul (or a Gemm with
  alpha 1, no transA and, when it has a bias C, beta 1) becomes one com.microsoft MatMulNBits node
  (K, N, bits, block_size attributes; B packed [N, blocks, block_size * bits / 8] low nibble first,
  scales [N * blocks], zero points packed the same way as unsigned codes; signed codes are stored + 2^(b-1)
  with that as their zero point, which MatMulNBits assumes when none is given); a Gemm's bias becomes an
  Add after it.

onnxruntime then multiplies in float32: the product agrees with the simulation's within the float32
rounding of a different summation order (its GEMM kernels are not numpy's).  MatMulNBits nodes are written
without ``accuracy_level`` (0: float32 activations).  Beware with 'qdq': onnxruntime (1.32) at
ORT_ENABLE_ALL fuses each blocked DequantizeLinear -> MatMul into MatMulNBits with the accuracy level of the
session option ``session.qdq_matmulnbits_accuracy_level``, default 4, which quantizes the activations to
int8 per block (W4A8, not what the file says); set that option to "0" (or run below ORT_ENABLE_ALL) to run
the file as simulated.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..core.errors import ExportError
from ..core.quant_block import BlockQuantizationConfig, block_count

__all__ = ["block_dequantize_node", "to_matmul_nbits", "MICROSOFT_DOMAIN"]

MICROSOFT_DOMAIN = "com.microsoft"


def _code_tensor(name: str, codes: np.ndarray, bits: int, signed: bool) -> onnx.TensorProto:
    if bits == 4:   # raw little-endian nibbles, the first value in the low one (ONNX's packing of int4/uint4)
        kind = TensorProto.INT4 if signed else TensorProto.UINT4
        flat = (codes.astype(np.int64).reshape(-1) & 0xF).astype(np.uint8)
        flat = np.concatenate([flat, np.zeros(len(flat) % 2, np.uint8)])
        packed = (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8)
        return helper.make_tensor(name, kind, codes.shape, packed.tobytes(), raw=True)
    return numpy_helper.from_array(codes.astype(np.int8 if signed else np.uint8), name)


def block_dequantize_node(builder, config: BlockQuantizationConfig, base: str) -> str:
    """Write the block weight of ``config`` as initializers + blocked DequantizeLinear through ``builder``
    (the QDQ exporter's ``_Builder``); returns the dequantized tensor's name."""
    key = ("block_dq", id(config.codes), config.block_size)
    output = builder.initializer_keys.get(key)
    if output is not None:
        return output
    signed = config.policy.symmetric
    codes_name = builder.unique(f"{base}_quantized")
    builder.initializers.append(_code_tensor(codes_name, np.asarray(config.codes), config.num_of_bits, signed))
    scale_name = builder.constant(f"{base}_scale", np.asarray(config.scale, np.float32))
    inputs = [codes_name, scale_name]
    if not signed:
        zero_name = builder.unique(f"{base}_zero_point")
        builder.initializers.append(_code_tensor(zero_name, np.asarray(config.offset), config.num_of_bits, False))
        inputs.append(zero_name)
    output = builder.initializer_keys[key] = builder.unique(f"{base}_dequantized")
    builder.nodes.append(helper.make_node("DequantizeLinear", inputs, [output],
                                          name=builder.unique(f"{base}_DequantizeLinear"),
                                          axis=int(config.channel_axis), block_size=int(config.block_size)))
    builder.counts["block_quantized_weights"] = builder.counts.get("block_quantized_weights", 0) + 1
    return output


# ------------------------------------------------------------------ MatMulNBits

def _pack(codes_nk: np.ndarray, bits: int, block_size: int) -> np.ndarray:
    """[N, K] unsigned codes as MatMulNBits' B: [N, blocks, block_size * bits / 8] uint8 (4 bits: the
    even position in the low nibble), the last block zero-padded."""
    columns, rows = codes_nk.shape
    blocks = block_count(rows, block_size)
    padded = np.zeros((columns, blocks * block_size), np.uint8)
    padded[:, :rows] = codes_nk
    padded = padded.reshape(columns, blocks, block_size)
    if bits == 8:
        return padded
    return (padded[..., 0::2] | (padded[..., 1::2] << 4)).astype(np.uint8)


def _pack_zero_points(zero_nb: np.ndarray, bits: int) -> np.ndarray:
    """[N, blocks] unsigned zero points as MatMulNBits packs them: 4 bits two per byte per row."""
    if bits == 8:
        return zero_nb.astype(np.uint8).reshape(-1)
    columns, blocks = zero_nb.shape
    padded = np.zeros((columns, blocks + blocks % 2), np.uint8)
    padded[:, :blocks] = zero_nb
    return (padded[:, 0::2] | (padded[:, 1::2] << 4)).astype(np.uint8).reshape(-1)


def _initializer_values(model: onnx.ModelProto) -> dict:
    return {tensor.name: tensor for tensor in model.graph.initializer}


def _as_int(tensor: onnx.TensorProto) -> np.ndarray:
    return np.asarray(numpy_helper.to_array(tensor)).astype(np.int64)


def to_matmul_nbits(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """``model`` with each blocked DequantizeLinear → MatMul/Gemm B written as MatMulNBits (module
    docstring), and how many were; any other blocked DequantizeLinear is an ExportError naming it."""
    graph = model.graph
    initializers = _initializer_values(model)
    readers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    graph_outputs = {output.name for output in graph.output}
    replaced: dict[str, list] = {}     # name of the MatMul/Gemm node -> its replacement nodes
    removed: set[str] = set()          # names of the DequantizeLinear nodes folded in
    new_initializers = []
    for node in graph.node:
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type != "DequantizeLinear" or not attributes.get("block_size"):
            continue
        users = readers.get(node.output[0], [])
        consumer = users[0] if len(users) == 1 else None
        if consumer is None or node.output[0] in graph_outputs or not _reads_as_b(consumer, node.output[0]):
            raise ExportError(f"block-quantized weight {node.input[0]!r} is not read by exactly one MatMul/Gemm "
                              "as its B input (with Gemm alpha 1, beta 1, no transA): write it with "
                              "weight_only_format='qdq'")
        codes = _as_int(initializers[node.input[0]])
        scale = numpy_helper.to_array(initializers[node.input[1]]).astype(np.float32)
        kind = initializers[node.input[0]].data_type
        signed = kind in (TensorProto.INT4, TensorProto.INT8)
        bits = 4 if kind in (TensorProto.INT4, TensorProto.UINT4) else 8
        zero = _as_int(initializers[node.input[2]]) if len(node.input) > 2 and node.input[2] else None
        block_size, axis = int(attributes["block_size"]), int(attributes.get("axis", 1))
        if axis == 0:   # [K, N] -> [N, K]
            codes, scale, zero = codes.T, scale.T, None if zero is None else zero.T
        shift = 1 << (bits - 1) if signed else 0
        columns, rows = codes.shape
        base = node.input[0]
        packed = numpy_helper.from_array(_pack(codes + shift, bits, block_size), f"{base}_nbits")
        scales = numpy_helper.from_array(np.ascontiguousarray(scale).reshape(-1), f"{base}_nbits_scale")
        new_initializers += [packed, scales]
        inputs = [consumer.input[0], packed.name, scales.name]
        if zero is not None:
            zeros = numpy_helper.from_array(_pack_zero_points(zero + shift, bits), f"{base}_nbits_zero_point")
            new_initializers.append(zeros)
            inputs.append(zeros.name)
        bias = consumer.input[2] if consumer.op_type == "Gemm" and len(consumer.input) > 2 else ""
        product = consumer.output[0] if not bias else f"{consumer.output[0]}_nbits_product"
        nodes = [helper.make_node("MatMulNBits", inputs, [product], name=consumer.name or f"{base}_MatMulNBits",
                                  domain=MICROSOFT_DOMAIN, K=rows, N=columns, bits=bits, block_size=block_size)]
        if bias:
            nodes.append(helper.make_node("Add", [product, bias], [consumer.output[0]],
                                          name=f"{consumer.name}_bias"))
        replaced[id(consumer)] = nodes
        removed.add(id(node))
    if not replaced:
        return model, 0
    kept = []
    for node in graph.node:
        if id(node) in removed:
            continue
        kept.extend(replaced.get(id(node), [node]))
    used = {name for node in kept for name in node.input}
    initializers_kept = [tensor for tensor in graph.initializer if tensor.name in used]
    del graph.node[:]
    graph.node.extend(kept)
    del graph.initializer[:]
    graph.initializer.extend(initializers_kept + new_initializers)
    if not any(entry.domain == MICROSOFT_DOMAIN for entry in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MICROSOFT_DOMAIN, 1))
    return model, len(replaced)


def _reads_as_b(node: onnx.NodeProto, name: str) -> bool:
    """Whether ``node`` is a MatMul reading ``name`` as B (rank-2 weight) or a Gemm MatMulNBits can stand for."""
    if len(node.input) < 2 or node.input[1] != name or node.input[0] == name:
        return False
    if node.op_type == "MatMul":
        return True
    if node.op_type != "Gemm":
        return False
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return (attributes.get("alpha", 1.0) == 1.0 and not attributes.get("transA", 0)
            and (len(node.input) < 3 or not node.input[2] or attributes.get("beta", 1.0) == 1.0))
