"""What each input slot of an op type is, for quantization: activation, weight, bias, passive or none.

* ``activation``: a tensor computed at run time (or a constant operand of an
  elementwise op, quantized per tensor);
* ``weight``: the parameter of Conv/ConvTranspose/Gemm/MatMul, possibly per channel;
* ``bias``: int32 with scale S_input x S_weight (PASSIVE);
* ``passive``: Clip bounds and the Pad value, on the grid of input 0 (PASSIVE);
* ``none``: shapes, indices, sizes, roi and scales (the slots of
  ``dispatch_soi.SOI_INPUTS``), the weights, biases, sequence lengths and
  initial states of the recurrent ops (whose MatMuls run in float, see
  ``PlatformPolicy.recurrent``), and the extra operands of ops not listed
  here: never quantized.
"""

from __future__ import annotations

from types import MappingProxyType

from ..core.ir import Operation
from ..core.op_facts import RECURRENT_TYPES
from .dispatch_soi import soi_input_indices

ACTIVATION, WEIGHT, BIAS, PASSIVE, NONE = "activation", "weight", "bias", "passive", "none"

_COMPUTING = {"Conv": (ACTIVATION, WEIGHT, BIAS), "ConvTranspose": (ACTIVATION, WEIGHT, BIAS),
              "Gemm": (ACTIVATION, WEIGHT, BIAS), "MatMul": (ACTIVATION, WEIGHT)}
_SPECIAL = {"Clip": (ACTIVATION, PASSIVE, PASSIVE), "Pad": (ACTIVATION, NONE, PASSIVE, NONE)}
#: X, then W, R, B, sequence_lens, initial_h (and LSTM's initial_c, P)
_RECURRENT = {op_type: (ACTIVATION,) + (NONE,) * 7 for op_type in RECURRENT_TYPES}
#: Ops where every input is data.
_ALL_DATA = frozenset({"Add", "Sub", "Mul", "Div", "Concat", "Max", "Min", "Sum", "Mean", "Where", "PRelu",
                       "Equal", "Greater", "Less"})

SLOT_TABLE = MappingProxyType({**_COMPUTING, **_SPECIAL, **_RECURRENT})

def input_slots(operation: Operation) -> tuple[str, ...]:
    """The kind of every input slot of ``operation`` (see the module docstring)."""
    count = len(operation.inputs)
    if operation.type in SLOT_TABLE:
        kinds = SLOT_TABLE[operation.type]
    elif operation.type in _ALL_DATA:
        kinds = (ACTIVATION,) * count
    else:  # input 0 is the data unless it is a shape slot (SOI_INPUTS); the other inputs are never quantized
        kinds = (NONE if 0 in soi_input_indices(operation) else ACTIVATION,)
    kinds = tuple(kinds[:count]) + (NONE,) * max(0, count - len(kinds))
    if operation.type == "MatMul" and count == 2:
        second = operation.inputs[1]
        if second is None or not second.is_parameter:
            kinds = (ACTIVATION, ACTIVATION)
    return kinds
