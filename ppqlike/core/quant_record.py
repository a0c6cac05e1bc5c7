"""The record of a tensor quantization config: its JSON form (what the config JSON export writes and reads
back) and its one-line repr, a mixin of :class:`ppqlike.core.quant.TensorQuantizationConfig`.

Reads and writes the config's own fields (``_state``, ``_masters``, ...); links masters only through
``lookup`` and refuses one that would close a cycle, as ``dominated_by`` does.
"""

from __future__ import annotations

import copy as _copy
from typing import Callable

from ppqlike.core.errors import QuantizationStateError
from ppqlike.core.quant_policy import QuantizationPolicy
from ppqlike.core.quant_states import QuantizationStates
from ppqlike.core.requantization import IntegerRequantization


class ConfigRecord:
    """to_dict / from_dict / repr of a TensorQuantizationConfig."""

    def to_dict(self) -> dict:
        """JSON-ready dict of the values in use (scale/offset: number, or list per channel)."""
        scale, offset = self._resolve()
        return {
            "name": self.name, "state": self._state.name,
            "dequantized_from": None if self._dequantized_from is None else self._dequantized_from.name,
            "policy": self.policy.to_dict()["properties"], "rounding": self._rounding.name,
            "num_of_bits": self.num_of_bits, "quant_min": self.quant_min, "quant_max": self.quant_max,
            "channel_axis": self.channel_axis, "observer_algorithm": self.observer_algorithm,
            "scale": _to_json(scale, float), "offset": _to_json(offset, int),
            "masters": [m.name for m in self._masters], "detail": _copy.deepcopy(self.detail),
            "requantization": None if self.requantization is None else self.requantization.to_dict(),
            "runtime_kernel": self.runtime_kernel,
            **({} if self.float_format is None else {"float_format": self.float_format.name}),
        }

    @classmethod
    def from_dict(cls, data: dict, lookup: Callable[[str], "TensorQuantizationConfig"] | None = None
                  ) -> "TensorQuantizationConfig":
        """Rebuild from :meth:`to_dict`.  The exported values become its own;
        with ``lookup`` (master name -> config) the master links are restored too."""
        cfg = cls(QuantizationPolicy.from_dict(data["policy"]), data.get("rounding", "ROUND_HALF_EVEN"),
                  data["num_of_bits"], data["quant_min"], data["quant_max"],
                  observer_algorithm=data.get("observer_algorithm", "minmax"),
                  channel_axis=data.get("channel_axis"), name=data.get("name", ""), detail=data.get("detail"),
                  float_format=data.get("float_format"))
        cfg.requantization = IntegerRequantization.from_dict(data.get("requantization"))
        cfg.runtime_kernel = data.get("runtime_kernel")
        if data.get("scale") is not None:
            cfg._store(data["scale"], data.get("offset") or 0)
        cfg._state = QuantizationStates(data["state"])
        prev = data.get("dequantized_from")
        cfg._dequantized_from = None if prev is None else QuantizationStates(prev)
        names = data.get("masters") or []
        if lookup is not None and names:
            masters = tuple(lookup(n) for n in names)
            for m in masters:
                if m is cfg or m._reaches(cfg):
                    raise QuantizationStateError(f"{cfg._who()}: master {m._who()} would close a cycle")
            cfg._masters = masters
        return cfg

    def __repr__(self) -> str:
        scale, offset = self._resolve()
        if scale is None:
            params = "no scale"
        elif scale.ndim == 0:
            params = f"scale={float(scale):.6g} offset={int(offset)}"
        else:
            params = f"{scale.size} channels on axis {self.channel_axis}"
        under = f" under {self._masters[0].name!r}" if self._masters else ""
        fmt = self.float_format
        width = f"{fmt.name}" if fmt is not None else f"{self.num_of_bits}b"
        return (f"TQC({self.name!r} {self._state.name}{under} {width}"
                f"[{self.quant_min},{self.quant_max}] {params})")


def _to_json(value, kind):
    if value is None:
        return None
    return kind(value) if value.ndim == 0 else [kind(v) for v in value.tolist()]
