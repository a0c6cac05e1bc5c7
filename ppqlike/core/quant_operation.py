"""The configs of one operation: a TensorQuantizationConfig (or None) per input and output slot."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Sequence

from ppqlike.core.errors import QuantizationStateError
from ppqlike.core.quant import TensorQuantizationConfig

__all__ = ["OperationQuantizationConfig"]


class OperationQuantizationConfig:
    """Per-operation configs aligned with the op's inputs and outputs (None = slot not quantized)."""

    def __init__(self, input_quantization_config: Iterable[TensorQuantizationConfig | None] = (),
                 output_quantization_config: Iterable[TensorQuantizationConfig | None] = ()):
        self.input_quantization_config: list[TensorQuantizationConfig | None] = list(input_quantization_config)
        self.output_quantization_config: list[TensorQuantizationConfig | None] = list(output_quantization_config)

    def iter_configs(self) -> Iterator[tuple[str, int, TensorQuantizationConfig]]:
        """(``"input"``/``"output"``, slot index, config) for every quantized slot."""
        for side, configs in (("input", self.input_quantization_config),
                              ("output", self.output_quantization_config)):
            for index, cfg in enumerate(configs):
                if cfg is not None:
                    yield side, index, cfg

    def all_configs(self) -> list[TensorQuantizationConfig]:
        """Every non-None config, inputs first."""
        return [cfg for _, _, cfg in self.iter_configs()]

    def pairs(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> Iterator[tuple[Any, TensorQuantizationConfig]]:
        """(tensor, config) for every quantized slot, given the op's input and output tensors."""
        if len(inputs) != len(self.input_quantization_config) or \
                len(outputs) != len(self.output_quantization_config):
            raise QuantizationStateError(
                f"op has {len(inputs)} inputs/{len(outputs)} outputs but its config has "
                f"{len(self.input_quantization_config)}/{len(self.output_quantization_config)}")
        for tensor, cfg in zip(list(inputs) + list(outputs),
                               self.input_quantization_config + self.output_quantization_config):
            if cfg is not None:
                yield tensor, cfg

    def copy(self) -> "OperationQuantizationConfig":
        """Copies of every config; master links between this op's own configs point to the copies."""
        mapping = {id(c): c.copy() for c in self.all_configs()}
        for new in mapping.values():
            new._masters = tuple(mapping.get(id(m), m) for m in new._masters)
        return OperationQuantizationConfig(
            [None if c is None else mapping[id(c)] for c in self.input_quantization_config],
            [None if c is None else mapping[id(c)] for c in self.output_quantization_config])

    def to_dict(self) -> dict:
        """``{"inputs": [dict|None], "outputs": [dict|None]}``."""
        return {"inputs": [None if c is None else c.to_dict() for c in self.input_quantization_config],
                "outputs": [None if c is None else c.to_dict() for c in self.output_quantization_config]}

    @classmethod
    def from_dict(cls, data: dict, lookup: Callable[[str], TensorQuantizationConfig] | None = None
                  ) -> "OperationQuantizationConfig":
        """Inverse of :meth:`to_dict` (see :meth:`TensorQuantizationConfig.from_dict`)."""
        def load(items):
            return [None if d is None else TensorQuantizationConfig.from_dict(d, lookup) for d in items]
        return cls(load(data.get("inputs", [])), load(data.get("outputs", [])))

    def __repr__(self) -> str:
        def short(configs):
            return "[" + ", ".join("-" if c is None else c.state.name for c in configs) + "]"
        return (f"OperationQuantizationConfig(inputs={short(self.input_quantization_config)}, "
                f"outputs={short(self.output_quantization_config)})")
