"""Quantization properties (flags) and the validated policy built from them."""

from __future__ import annotations

import enum
from typing import Iterable

from ppqlike.core.errors import QuantizationPolicyError

__all__ = ["QuantizationProperty", "QuantizationPolicy"]


class QuantizationProperty(enum.Flag):
    """One aspect of how a tensor is quantized; combine with ``|``."""

    PER_TENSOR = enum.auto()    #: one scale/offset for the whole tensor
    PER_CHANNEL = enum.auto()   #: one scale/offset per channel along ``channel_axis``
    LINEAR = enum.auto()        #: affine integer grid r = S * (q - Z)
    POWER_OF_2 = enum.auto()    #: scales are powers of two (shift instead of multiply)
    SYMMETRICAL = enum.auto()   #: Z fixed (0 for signed ranges)
    ASYMMETRICAL = enum.auto()  #: Z from the range


_Q = QuantizationProperty
_ORDER = [_Q.PER_TENSOR, _Q.PER_CHANNEL, _Q.LINEAR, _Q.POWER_OF_2, _Q.SYMMETRICAL, _Q.ASYMMETRICAL]


def _names(flags: QuantizationProperty) -> list[str]:
    return [p.name for p in _ORDER if p in flags]


class QuantizationPolicy:
    """A validated combination of :class:`QuantizationProperty` flags.

    Exactly one of PER_TENSOR/PER_CHANNEL, exactly one of
    SYMMETRICAL/ASYMMETRICAL, LINEAR required, POWER_OF_2 optional; anything
    else raises QuantizationPolicyError naming the combination.  Immutable,
    hashable, equal when the flags are equal.
    """

    __slots__ = ("_flags",)

    def __init__(self, flags: QuantizationProperty | Iterable[QuantizationProperty | str]):
        if not isinstance(flags, QuantizationProperty):
            combined = QuantizationProperty(0)
            for item in flags:
                combined |= _parse_property(item)
            flags = combined
        self._validate(flags)
        object.__setattr__(self, "_flags", flags)

    @staticmethod
    def _validate(flags: QuantizationProperty) -> None:
        shown = "|".join(_names(flags)) or "(no flags)"
        problems = []
        if (_Q.PER_TENSOR in flags) == (_Q.PER_CHANNEL in flags):
            problems.append("exactly one of PER_TENSOR, PER_CHANNEL")
        if (_Q.SYMMETRICAL in flags) == (_Q.ASYMMETRICAL in flags):
            problems.append("exactly one of SYMMETRICAL, ASYMMETRICAL")
        if _Q.LINEAR not in flags:
            problems.append("LINEAR")
        if problems:
            raise QuantizationPolicyError(f"invalid quantization policy {shown}: needs " + "; ".join(problems))

    def __setattr__(self, name, value):
        raise AttributeError("QuantizationPolicy is immutable")

    def __reduce__(self):
        return (QuantizationPolicy, (self._flags,))

    def __copy__(self) -> "QuantizationPolicy":
        return self

    def __deepcopy__(self, memo) -> "QuantizationPolicy":
        return self

    @property
    def flags(self) -> QuantizationProperty:
        """The combined flags."""
        return self._flags

    def has_property(self, prop: QuantizationProperty) -> bool:
        """Whether every flag in ``prop`` is set."""
        return (self._flags & prop) == prop

    @property
    def per_channel(self) -> bool:
        """PER_CHANNEL is set."""
        return _Q.PER_CHANNEL in self._flags

    @property
    def symmetric(self) -> bool:
        """SYMMETRICAL is set."""
        return _Q.SYMMETRICAL in self._flags

    @property
    def power_of_2(self) -> bool:
        """POWER_OF_2 is set."""
        return _Q.POWER_OF_2 in self._flags

    def __eq__(self, other) -> bool:
        if isinstance(other, QuantizationPolicy):
            return self._flags == other._flags
        return NotImplemented

    def __hash__(self) -> int:
        return hash(("QuantizationPolicy", self._flags.value))

    def __repr__(self) -> str:
        return f"QuantizationPolicy({'|'.join(_names(self._flags))})"

    def to_dict(self) -> dict:
        """``{"properties": [flag names]}`` for JSON."""
        return {"properties": _names(self._flags)}

    @classmethod
    def from_dict(cls, data) -> "QuantizationPolicy":
        """Inverse of :meth:`to_dict`; a bare list of flag names is accepted too."""
        if isinstance(data, dict):
            if "properties" not in data:
                raise QuantizationPolicyError(f"policy dict without 'properties': {data!r}")
            data = data["properties"]
        return cls(list(data))


def _parse_property(item) -> QuantizationProperty:
    if isinstance(item, QuantizationProperty):
        return item
    try:
        return QuantizationProperty[str(item)]
    except KeyError:
        known = ", ".join(p.name for p in _ORDER)
        raise QuantizationPolicyError(f"unknown quantization property {item!r}; expected one of {known}") from None
