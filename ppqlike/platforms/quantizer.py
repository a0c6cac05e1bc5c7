"""The platform quantizer: one policy object says everything a platform does; one class applies it.

A :class:`PlatformPolicy` states, in one place, a platform's bits and ranges,
symmetry, granularity, rounding, power-of-2 scales, the op types it
quantizes, the activations it fuses, how it aligns Add and Concat inputs,
its default observers, whether bias is int32, and its exporter.  Platforms
that differ in a setting or two are two policies, not two classes.

:class:`PlatformQuantizer` writes an INITIAL OperationQuantizationConfig, from
the policy alone, on every op the dispatcher sent to the platform, and no
config on FP32 and SOI ops; the refine pass then corrects each config from
the op's semantics (shape slots SOI, bias and bounds PASSIVE_INIT, integer
tensors FP32).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..core.errors import PlatformError
from ..core.float_formats import float_format
from ..core.ir import Graph, Operation, Variable
from ..core.op_facts import weight_channel_axis
from ..core.quant_operation import OperationQuantizationConfig
from ..core.quant import (QuantizationPolicy, QuantizationProperty,
                          QuantizationStates, RoundingPolicy, TensorQuantizationConfig)
from . import slots
from .target import TargetPlatform

P = QuantizationProperty


@dataclass(frozen=True)
class TensorPolicy:
    """How one kind of tensor (activations or weights) is quantized on a platform."""

    num_of_bits: int = 8
    symmetric: bool = True
    per_channel: bool = False
    signed: bool = True
    narrow_range: bool = False       # [-127, 127] instead of [-128, 127]
    power_of_2: bool = False
    observer: str = "minmax"
    unsigned_non_negative: bool = False   # a symmetric tensor whose calibration minimum is >= 0 is unsigned
    float_format: str | None = None  # a float grid ('E4M3FN', 'E5M2', 'FP16', 'BF16'; core.float_formats) or None

    def quant_range(self) -> tuple[int, int]:
        """(quant_min, quant_max) of this policy ([-max, max] for a float format)."""
        if self.float_format is not None:
            return float_format(self.float_format).quant_range
        if not self.signed:
            return 0, 2 ** self.num_of_bits - 1
        low, high = -(2 ** (self.num_of_bits - 1)), 2 ** (self.num_of_bits - 1) - 1
        return (low + 1 if self.narrow_range else low), high

    def quantization_policy(self, per_channel: bool | None = None) -> QuantizationPolicy:
        """The QuantizationPolicy flags of this tensor policy."""
        per_channel = self.per_channel if per_channel is None else per_channel
        flags = (P.PER_CHANNEL if per_channel else P.PER_TENSOR) | P.LINEAR
        flags |= P.SYMMETRICAL if self.symmetric else P.ASYMMETRICAL
        if self.power_of_2:
            flags |= P.POWER_OF_2
        return QuantizationPolicy(flags)


#: What a platform may do with a transformer block (:mod:`ppqlike.core.patterns`): ``quantize`` — it runs on the
#: integer grid (a computing op reads int8; a LayerNorm/GELU/Softmax block reads and writes int8 and computes
#: inside in float, as a lookup table or a fused kernel does); ``float`` — it runs in float and its result is
#: not quantized (its consumers quantize what they read).
BLOCK_TREATMENTS = ("quantize", "float")


@dataclass(frozen=True)
class TransformerPolicy:
    """What a platform does with each kind of transformer block (values from :data:`BLOCK_TREATMENTS`).

    ``layer_norm`` covers RMSNorm too (a LayerNorm block of form ``rms_norm``), and ``gelu`` every form of GELU
    (erf, tanh, quick) and the activations written out as several ops (an ``Activation`` block: HardSwish, SiLU,
    Mish): the targets treat these pointwise functions alike."""

    layer_norm: str = "float"
    gelu: str = "quantize"
    softmax: str = "quantize"
    attention_matmul: str = "quantize"
    probability_matmul: str = "quantize"
    residual_add: str = "quantize"
    embedding: str = "float"

    def __post_init__(self):
        for kind, value in self.as_dict().items():
            if value not in BLOCK_TREATMENTS:
                raise PlatformError(f"transformer policy: {kind} treatment {value!r} is not one of "
                                    f"{', '.join(BLOCK_TREATMENTS)}")

    def treatment(self, kind: str) -> str:
        """The treatment of a block kind ('LayerNorm', 'Gelu', 'Activation', 'Softmax', 'AttentionMatMul',
        'ProbabilityMatMul', 'ResidualAdd', 'Embedding')."""
        return getattr(self, _BLOCK_FIELDS[kind])

    def as_dict(self) -> dict[str, str]:
        """Block kind -> treatment."""
        return {kind: getattr(self, name) for kind, name in _BLOCK_FIELDS.items()}


_BLOCK_FIELDS = {"LayerNorm": "layer_norm", "Gelu": "gelu", "Activation": "gelu", "Softmax": "softmax",
                 "AttentionMatMul": "attention_matmul", "ProbabilityMatMul": "probability_matmul",
                 "ResidualAdd": "residual_add", "Embedding": "embedding"}


DEFAULT_QUANTIZABLE_TYPES = frozenset({
    "Conv", "ConvTranspose", "Gemm", "MatMul", "Add", "Sub", "Mul", "Concat", "Relu", "Clip", "LeakyRelu",
    "PRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "MaxPool", "AveragePool", "GlobalAveragePool",
    "GlobalMaxPool", "Pad", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Slice", "Resize",
    "Split", "ReduceMean", "Gelu"})


@dataclass(frozen=True)
class PlatformPolicy:
    """Everything a platform decides about quantization, in one place.

    ``recurrent`` says what the platform does with LSTM, GRU and RNN (``core.op_facts.RECURRENT_TYPES``):
    ``float`` (every built-in platform) — the op runs in float, its MatMuls too; its input is dequantized where
    the op that produced it is quantized, and its consumers quantize what they read.  ``quantize`` — the op
    reads X on the integer grid and writes Y, Y_h and Y_c quantized, computing in float inside (a runtime that
    wraps a float cell in int8 I/O).  W, R, B, the initial states and sequence_lens are never quantized: no
    target here runs the recurrent MatMuls in int8 (onnx-tensorrt runs LSTM/GRU/RNN in FP32/FP16 only; TPU-MLIR
    lowers them to F32 in int8 mode; onnxruntime's static QDQ quantizer leaves LSTM float, its integer LSTM
    being the dynamically quantized com.microsoft DynamicQuantizeLSTM).
    """

    platform: TargetPlatform
    activation: TensorPolicy = TensorPolicy()
    weight: TensorPolicy = TensorPolicy(per_channel=True, narrow_range=True)
    rounding: RoundingPolicy = RoundingPolicy.ROUND_HALF_EVEN
    bias_int32: bool = True                     # False: bias stays float (TensorRT)
    quantizable_types: frozenset = DEFAULT_QUANTIZABLE_TYPES
    fused_activations: frozenset = frozenset({"Relu", "Clip"})
    add_alignment: str = "none"                 # 'none' | 'larger' | 'output'
    concat_alignment: bool = True
    integer_requantization: bool = False        # True: multiplier + right shift (TPU-MLIR)
    runtime_kernels: str | None = None          # 'onnxruntime': simulate its integer CPU kernels bit for bit
    higher_precision_bits: int | str | None = None  # wider integer grid single layers may use (accuracy target,
    #                                  protection), or a float format ('BF16', 'F16': TPU-MLIR); None: FP32 only
    wider_grid_runs_float: bool = False         # the runtime computes those layers with float kernels between
    #                                  Q/DQ pairs (onnxruntime's CPU int16 QDQ): the protection's fronts go FP32
    exporter: str = "qdq_onnx"
    placement: str = "every_output"             # or 'compute_inputs' (TensorRT): ppqlike.optim.passes.placement
    transformer_placement: str | None = None    # the placement of a graph with LayerNorms (None: ``placement``)
    transformer: TransformerPolicy = TransformerPolicy()
    recurrent: str = "float"                    # LSTM, GRU, RNN: 'float' or 'quantize' (class docstring)
    description: str = ""
    extra: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        if self.recurrent not in BLOCK_TREATMENTS:
            raise PlatformError(f"{self.platform.name} policy: recurrent treatment {self.recurrent!r} is not one of "
                                f"{', '.join(BLOCK_TREATMENTS)}")

    def with_changes(self, **changes) -> "PlatformPolicy":
        """A copy with some settings changed (e.g. another observer)."""
        return replace(self, **changes)


class PlatformQuantizer:
    """Writes INITIAL quantization configs on every op dispatched to ``policy.platform``."""

    def __init__(self, policy: PlatformPolicy):
        self.policy = policy

    @property
    def platform(self) -> TargetPlatform:
        return self.policy.platform

    def _tensor_config(self, tensor_policy: TensorPolicy, name: str, per_channel: bool = False,
                       channel_axis: int | None = None) -> TensorQuantizationConfig:
        low, high = tensor_policy.quant_range()
        return TensorQuantizationConfig(
            tensor_policy.quantization_policy(per_channel), self.policy.rounding, tensor_policy.num_of_bits,
            low, high, observer_algorithm=tensor_policy.observer,
            channel_axis=channel_axis if per_channel else None, name=name, float_format=tensor_policy.float_format)

    def _bias_config(self, name: str, channel_axis: int | None) -> TensorQuantizationConfig:
        weight = self.policy.weight
        flags = (P.PER_CHANNEL if weight.per_channel else P.PER_TENSOR) | P.LINEAR | P.SYMMETRICAL
        config = TensorQuantizationConfig(QuantizationPolicy(flags), self.policy.rounding, 32,
                                          -(2 ** 31), 2 ** 31 - 1, observer_algorithm="passive",
                                          channel_axis=0 if weight.per_channel else None, name=name)
        config.state = QuantizationStates.PASSIVE_INIT
        return config

    def _weight_config(self, operation: Operation, variable: Variable) -> TensorQuantizationConfig:
        axis = weight_channel_axis(operation)
        per_channel = self.policy.weight.per_channel and axis is not None
        if operation.type == "ConvTranspose" and operation.attributes.get("group", 1) != 1:
            per_channel = False  # per-channel scales would not line up with the bias of each group
        return self._tensor_config(self.policy.weight, variable.name, per_channel, axis)

    def bias_config(self, name: str) -> TensorQuantizationConfig:
        """The PASSIVE_INIT int32 config of a computing op's bias (scale S_input * S_weight, set later)."""
        return self._bias_config(name, 0)

    def passive_config(self, name: str) -> TensorQuantizationConfig:
        """The PASSIVE_INIT config of a Clip bound or Pad value (it takes the grid of input 0)."""
        config = self._tensor_config(self.policy.activation, name)
        config.observer_algorithm = "passive"
        config.state = QuantizationStates.PASSIVE_INIT
        return config

    def init_quantize_config(self, operation: Operation) -> OperationQuantizationConfig:
        """The INITIAL config of ``operation``, from the policy alone: a weight config on the weight slot of
        a computing op, an activation config on every other present input and output.  The refine pass
        (``ppqlike.optim.passes.refine``) then corrects it from the op's semantics."""
        inputs = [None if variable is None else
                  self._weight_config(operation, variable) if kind == slots.WEIGHT and variable.is_parameter else
                  self._tensor_config(self.policy.activation, variable.name)
                  for variable, kind in zip(operation.inputs, slots.input_slots(operation))]
        outputs = [None if variable is None else self._tensor_config(self.policy.activation, variable.name)
                   for variable in operation.outputs]
        return OperationQuantizationConfig(inputs, outputs)

    def quantize(self, graph: Graph) -> int:
        """Write configs on every op whose ``platform`` is this platform; returns how many."""
        count = 0
        for operation in graph.topological_sort():
            if operation.platform == self.platform:
                operation.config = self.init_quantize_config(operation)
                count += 1
            else:
                operation.config = None
        return count
