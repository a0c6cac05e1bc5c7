"""``ppqlike inspect MODEL.onnx``: what an already quantized model (QDQ or QOperator) holds, as ppqlike imports it."""

from __future__ import annotations

import argparse
from collections import Counter

import numpy as np


def add_inspect_parser(commands) -> None:
    inspect = commands.add_parser(
        "inspect", help="show what a quantized ONNX model (QDQ or QOperator) holds, as ppqlike imports it",
        description=run_inspect.__doc__)
    inspect.add_argument("model", help="a quantized ONNX model (QuantizeLinear/DequantizeLinear or QLinear* nodes)")
    inspect.add_argument("--all", action="store_true", help="list every quantized tensor, not only a summary")
    inspect.set_defaults(run=run_inspect)


def describe(config) -> str:
    """One line: bits, range, granularity and the scale(s) of a config."""
    scale = np.asarray(config.scale)
    offset = np.asarray(config.offset)
    if scale.ndim == 0:
        grid = f"scale {float(scale):.6g} zero point {int(offset)}"
    else:
        grid = f"{scale.size} channels on axis {config.channel_axis}, scales {scale.min():.3g}..{scale.max():.3g}"
    return f"{config.num_of_bits}-bit [{config.quant_min}, {config.quant_max}] {grid}"


def run_inspect(args: argparse.Namespace) -> int:
    """Import the quantized model and print its format, the quantized ops and each tensor's quantization."""
    from ..api import import_quantized_onnx
    from ..core.quant import QuantizationStates as S
    from ..core.quant_graph import configured_operations

    graph = import_quantized_onnx(args.model)
    facts = graph.metadata["quantization"]["imported"]
    operations = list(configured_operations(graph))
    print(f"{args.model}: {facts['format']} model, {len(graph.operations)} ops, {facts['quantized_ops']} quantized")
    print(f"  quantized activations {facts['activations']}, weights {facts['weights']}, int32 biases "
          f"{facts['biases']}; onnxruntime runs {facts['runtime_kernels']} ops as integer kernels")
    if facts["restored_relus"]:
        print(f"  {facts['restored_relus']} Relus restored where the file's quantizer folded them into ranges "
              "starting at zero (the float graph for error analysis; quantized values unchanged)")
    if facts["kernels_with_8bit_weights"]:
        print(f"  note: {facts['kernels_with_8bit_weights']} integer kernels have weights beyond 7 bits; onnxruntime "
              "on x86 CPUs without VNNI may saturate them" + (" (this CPU is one)" if facts["saturating_cpu"] else ""))
    types = Counter(op.type for op in operations)
    print("  quantized op types: " + ", ".join(f"{t} {n}" for t, n in types.most_common()))
    bits = Counter(f"{c.num_of_bits}-bit {'per-channel' if np.ndim(c.scale) else 'per-tensor'} "
                   f"{'symmetric' if c.policy.symmetric else 'asymmetric'}"
                   for op in operations for c in op.config.all_configs() if c.state in (S.ACTIVATED, S.BAKED))
    print("  grids: " + ", ".join(f"{k} x{n}" for k, n in bits.most_common()))
    if args.all:
        for operation in operations:
            for side, slot, config in operation.config.iter_configs():
                if config.state in (S.ACTIVATED, S.BAKED, S.PASSIVE_BAKED):
                    print(f"  {operation.name} {side} {slot} {config.name!r} {config.state.name}: {describe(config)}")
    return 0
