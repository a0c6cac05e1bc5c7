"""Tensor and operation quantization configs: where quantization state lives (DESIGN.md §3).

Masters, in one rule: a config with masters reads its scale and offset from
them, live, on every access; it never holds a copy.

* OVERLAPPED / SLAVE: exactly one master.  The config quantizes exactly like
  it: scale, offset, policy, num_of_bits, quant_min, quant_max and
  channel_axis all come from the master (chains resolve; a per-channel
  master makes a per-channel slave).  Rounding stays the config's own.
* PASSIVE_INIT / PASSIVE / PASSIVE_BAKED: one or more masters.  One master
  (clip or pad value): its scale and offset.  Several (bias of Conv/Gemm):
  scale = product of their scales (S_input * S_weight, per channel when the
  weight is), offset 0.  Bits, range and channel_axis stay the config's own.
  Without masters a passive config uses the scale set on it explicitly.

Links are made only by :meth:`TensorQuantizationConfig.dominated_by`, which
refuses a link that would close a cycle, so resolution always terminates.
Leaving the governed states (and DEQUANTIZED) drops the masters.
"""

from __future__ import annotations

import copy as _copy
from typing import Sequence

import numpy as np

from ppqlike.core import numerics
from ppqlike.core.clipped_quantization import clipped_fake_quantizer
from ppqlike.core.errors import QuantizationStateError
from ppqlike.core.float_configs import checked_float_format, float_call, float_fake_quantizer
from ppqlike.core.quant_grid import QuantGridBase, default_quant_range, readonly
from ppqlike.core.quant_policy import QuantizationPolicy, QuantizationProperty
from ppqlike.core.quant_record import ConfigRecord
from ppqlike.core.quant_states import (
    DEQUANTIZABLE_STATES, GOVERNED_STATES, STATE_TRANSITIONS, QuantizationStates,
    can_transition, is_applied, is_baked, is_dequantizable, is_governed,
)
from ppqlike.core.requantization import IntegerRequantization
from ppqlike.core.revision import Revised
from ppqlike.core.rounding import RoundingPolicy

__all__ = [
    "RoundingPolicy", "QuantizationStates", "STATE_TRANSITIONS", "QuantizationProperty",
    "QuantizationPolicy", "TensorQuantizationConfig",
    "is_applied", "is_baked", "is_governed", "is_dequantizable", "can_transition",
    "default_quant_range", "IntegerRequantization",
]

S = QuantizationStates
_ONE_MASTER = (S.OVERLAPPED, S.SLAVE)
_FROZEN = (S.BAKED, S.PASSIVE_BAKED, S.SOI, S.DEQUANTIZED)  # own scale/offset may not change


class TensorQuantizationConfig(QuantGridBase, Revised, ConfigRecord):
    """How one input or output of one operation is quantized, and in which state.

    ``state`` changes go through :data:`STATE_TRANSITIONS`; an illegal change
    raises QuantizationStateError naming the tensor and both states.  Entering
    ACTIVATED/BAKED needs an own scale; OVERLAPPED/SLAVE a master (use
    :meth:`dominated_by`).  Scales are stored as float32 (what exported models
    hold), offsets as int64; per tensor a 0-d array, per channel a 1-D one.
    quant_min/quant_max default to signed [-2^(b-1), 2^(b-1)-1] for symmetric
    policies and unsigned [0, 2^b-1] otherwise (pass [-127, 127] explicitly
    for narrow-range weights).
    """

    def __init__(self, policy: QuantizationPolicy | QuantizationProperty,
                 rounding: RoundingPolicy | str = RoundingPolicy.ROUND_HALF_EVEN,
                 num_of_bits: int = 8, quant_min: int | None = None, quant_max: int | None = None,
                 scale=None, offset=None, observer_algorithm: str = "minmax",
                 channel_axis: int | None = None, state: QuantizationStates = S.INITIAL,
                 name: str = "", detail: dict | None = None, float_format=None):
        self._masters: tuple[TensorQuantizationConfig, ...] = ()
        self._dequantized_from: QuantizationStates | None = None
        self._init_grid(name, policy, rounding, num_of_bits, quant_min, quant_max, channel_axis, float_format)
        self.observer_algorithm = observer_algorithm
        #: free-form facts passes report about this config (search candidates, AdaRound losses)
        self.detail: dict = dict(detail or {})
        #: the integer multiplier/shift of a computing op's output (IntegerRequantizationPass), or None
        self.requantization: IntegerRequantization | None = None
        #: the runtime whose integer kernel the simulation computes for the op (RuntimeKernelPass), or None
        self.runtime_kernel: str | None = None
        self.baked_value = None   # BAKED / PASSIVE_BAKED parameters: the value quantized once (read-only)
        state = QuantizationStates(state)
        if state in _ONE_MASTER or state is S.DEQUANTIZED:
            raise QuantizationStateError(
                f"{self._who()}: cannot be created {state.name}; create it, then use dominated_by()/set_dequantized()")
        if scale is not None or offset is not None:
            self._store(scale, offset)
        self._state = state
        if state in (S.ACTIVATED, S.BAKED) and self._scale is None:
            raise QuantizationStateError(f"{self._who()}: cannot be created {state.name} without a scale")

    # ------------------------------------------------------------ revision
    _CACHES = frozenset({"_revision", "_product_of"})   # (``Revised``: assignments that change nothing)

    @property
    def revision(self) -> int | tuple:
        """What identifies everything this config computes with, as it is now: a number that changes with
        any assignment to it (state, scale, offset, grid, rounding, baked value, requantization, masters),
        with its masters' revisions.  Numbers are never reused in a process, so equal revisions mean equal
        quantization: the executor keeps what it derives from configs under them.  (Scales, offsets and
        baked values are read-only arrays, replaced, never edited.)"""
        if not self._masters:
            return self._revision
        return (self._revision,) + tuple(master.revision for master in self._masters)

    # ------------------------------------------------------- masters and grid
    def _grid(self) -> "TensorQuantizationConfig":
        """The config whose grid (policy, bits, range, axis) applies: the end of the one-master chain."""
        cfg = self
        while cfg._masters and (cfg._state in _ONE_MASTER or cfg._dequantized_from in _ONE_MASTER):
            cfg = cfg._masters[0]
        return cfg

    def _grid_owned(self, what: str) -> None:
        if self._grid() is not self:
            raise QuantizationStateError(
                f"{self._who()} is {self._state.name} under {self._masters[0]._who()}: {what} comes from its master")
        if self._state in (S.BAKED, S.PASSIVE_BAKED, S.DEQUANTIZED):
            raise QuantizationStateError(f"{self._who()} is {self._state.name}: its {what} cannot change")

    def _resolve(self) -> tuple[np.ndarray | None, np.ndarray | None]:
        """(scale, offset) as used now: from the masters when there are any."""
        masters = self._masters
        if not masters:
            return self._scale, self._offset
        if len(masters) == 1:
            return masters[0]._resolve()
        scales = tuple(m._resolve()[0] for m in masters)
        if any(s is None for s in scales):
            return None, None
        made = getattr(self, "_product_of", None)   # (master scales, scale, offset): the masters' scales are
        if made is not None and len(made[0]) == len(scales) and all(a is b for a, b in zip(made[0], scales)):
            return made[1], made[2]                   # read-only arrays, replaced (never edited) when they change
        try:
            product = np.multiply.reduce(np.broadcast_arrays(*[s.astype(np.float64) for s in scales]))
        except ValueError:
            shapes = [s.shape for s in scales]
            raise QuantizationStateError(f"{self._who()}: master scales of shapes {shapes} do not combine") from None
        scale = readonly(np.asarray(product, dtype=np.float32))
        self._product_of = (scales, scale, readonly(np.zeros(scale.shape, dtype=np.int64)))
        return self._product_of[1:]

    # ------------------------------------------------------- scale and offset
    @property
    def scale(self) -> np.ndarray | None:
        """Scale in use (float32, read-only): from the masters when it has any."""
        return self._resolve()[0]

    @scale.setter
    def scale(self, value) -> None:
        self.set_scale_offset(value, None)

    @property
    def offset(self) -> np.ndarray | None:
        """Offset (zero point) in use (int64, read-only): from the masters when it has any."""
        return self._resolve()[1]

    @offset.setter
    def offset(self, value) -> None:
        self.set_scale_offset(None, value)

    def set_scale_offset(self, scale, offset) -> None:
        """Set own scale and/or offset (None keeps one); illegal while governed or frozen."""
        if self._masters:
            raise QuantizationStateError(f"{self._who()} is {self._state.name} under "
                                         f"{self._masters[0]._who()}: its scale/offset come from its masters")
        if self._state in _FROZEN:
            raise QuantizationStateError(f"{self._who()} is {self._state.name}: its scale/offset cannot change")
        self._store(scale, offset)

    # ------------------------------------------------------------ the state
    @property
    def state(self) -> QuantizationStates:
        """Current state; assignment is checked against STATE_TRANSITIONS."""
        return self._state

    @state.setter
    def state(self, new: QuantizationStates) -> None:
        new = QuantizationStates(new)
        cur = self._state
        if cur is S.DEQUANTIZED:
            if new is not self._dequantized_from:
                raise self._illegal(new, f"a DEQUANTIZED config only goes back to {self._dequantized_from.name}")
            self.restore()
            return
        if not can_transition(cur, new):
            raise self._illegal(new)
        if new is S.DEQUANTIZED:
            self.set_dequantized()
            return
        if new in _ONE_MASTER and len(self._masters) != 1:
            raise self._illegal(new, "it needs one master: use dominated_by()")
        keeps_masters = new in GOVERNED_STATES
        if new in (S.PASSIVE, S.PASSIVE_BAKED) and not self._masters and self._scale is None:
            raise self._illegal(new, "it has neither masters nor a scale")
        if new in (S.ACTIVATED, S.BAKED) and self._scale is None:
            raise self._illegal(new, "it has no scale of its own (detach() adopts the master's)")
        if not keeps_masters:
            self._masters = ()
        self._state = new

    def _illegal(self, new: QuantizationStates, why: str = "") -> QuantizationStateError:
        legal = ", ".join(sorted(s.name for s in STATE_TRANSITIONS[self._state])) or "none (reset() only)"
        reason = why or f"legal from {self._state.name}: {legal}"
        return QuantizationStateError(
            f"{self._who()}: illegal quantization state change {self._state.name} -> {new.name}: {reason}")

    @property
    def masters(self) -> tuple["TensorQuantizationConfig", ...]:
        """The governing configs (empty when it has none)."""
        return self._masters

    @property
    def master(self) -> "TensorQuantizationConfig | None":
        """The first governing config, or None."""
        return self._masters[0] if self._masters else None

    @property
    def is_governed(self) -> bool:
        """Whether it reads its scale/offset from masters."""
        return bool(self._masters)

    def dominated_by(self, master: "TensorQuantizationConfig | Sequence[TensorQuantizationConfig]",
                     state: QuantizationStates = S.OVERLAPPED) -> None:
        """Link to ``master`` (one config, or several for PASSIVE*) and move to ``state``.

        Re-pointing within OVERLAPPED/SLAVE/PASSIVE_INIT/PASSIVE keeps the
        state; otherwise the transition must be legal.  A link that would make
        a cycle raises.  Atomic: on error nothing changes.
        """
        state = QuantizationStates(state)
        masters = (master,) if isinstance(master, TensorQuantizationConfig) else tuple(master)
        if state not in GOVERNED_STATES:
            raise QuantizationStateError(f"{self._who()}: dominated_by() needs a governed state, not {state.name}")
        if state in _ONE_MASTER and len(masters) != 1:
            raise QuantizationStateError(f"{self._who()}: {state.name} takes exactly one master, got {len(masters)}")
        if not masters or not all(isinstance(m, TensorQuantizationConfig) for m in masters):
            raise QuantizationStateError(f"{self._who()}: masters must be TensorQuantizationConfigs")
        same = state is self._state and state is not S.PASSIVE_BAKED
        if not same and not can_transition(self._state, state):
            raise self._illegal(state)
        for m in masters:
            if m is self or m._reaches(self):
                raise QuantizationStateError(f"{self._who()}: making {m._who()} its master would close a cycle")
        self._masters = masters
        self._state = state

    def _reaches(self, target: "TensorQuantizationConfig") -> bool:
        stack, seen = list(self._masters), set()
        while stack:
            cfg = stack.pop()
            if cfg is target:
                return True
            if id(cfg) not in seen:
                seen.add(id(cfg))
                stack.extend(cfg._masters)
        return False

    def detach(self, state: QuantizationStates = S.ACTIVATED) -> None:
        """Drop the masters, adopting their current scale/offset as its own, and move to ``state``."""
        state = QuantizationStates(state)
        if not self._masters:
            raise QuantizationStateError(f"{self._who()}: detach() needs masters, it has none")
        if not can_transition(self._state, state) or state is S.DEQUANTIZED:
            raise self._illegal(state)
        grid = self._grid()
        scale, offset = self._resolve()
        if scale is None and state in (S.ACTIVATED, S.BAKED, S.PASSIVE, S.PASSIVE_BAKED):
            raise self._illegal(state, "its masters have no scale to adopt")
        if grid is not self:
            self._policy, self._bits, self._channel_axis = grid._policy, grid._bits, grid._channel_axis
            self._float_format = grid._float_format
            self._qmin, self._qmax = grid._qmin, grid._qmax
            self._rounding = grid._rounding if grid._float_format is not None else self._rounding
        self._scale, self._offset = scale, offset
        self._masters = ()
        self._state = state

    def set_dequantized(self) -> None:
        """Switch to DEQUANTIZED, remembering the current state for :meth:`restore`."""
        if not is_dequantizable(self._state):
            legal = ", ".join(sorted(s.name for s in DEQUANTIZABLE_STATES))
            raise self._illegal(S.DEQUANTIZED, f"only {legal} can be dequantized")
        self._dequantized_from = self._state
        self._state = S.DEQUANTIZED

    def restore(self) -> None:
        """Leave DEQUANTIZED for exactly the state it came from (masters and values untouched)."""
        if self._state is not S.DEQUANTIZED:
            raise QuantizationStateError(f"{self._who()}: restore() needs DEQUANTIZED, it is {self._state.name}")
        self._state, self._dequantized_from = self._dequantized_from, None

    @property
    def dequantized_from(self) -> QuantizationStates | None:
        """The state :meth:`restore` returns to (None unless DEQUANTIZED)."""
        return self._dequantized_from

    def reset(self) -> None:
        """Back to INITIAL from any state (SOI too): masters, scale, offset and what passes derived from
        them (integer requantization, runtime kernel) cleared."""
        self._state, self._dequantized_from = S.INITIAL, None
        self._masters, self._scale, self._offset = (), None, None
        self.requantization, self.runtime_kernel = None, None

    # --------------------------------------------------------------- numerics
    def _params(self):
        scale, offset = self._resolve()
        if scale is None:
            raise QuantizationStateError(f"{self._who()} ({self._state.name}) has no scale yet")
        grid = self._grid()
        axis = grid._channel_axis if scale.ndim else None
        return scale, offset, grid._qmin, grid._qmax, axis

    def _float_grid(self):
        """The float format of a float grid (its rounding, the grid's own, and offset checked), or None."""
        grid = self._grid()
        return checked_float_format(grid._float_format, grid._rounding, self._resolve()[1], self._who())

    def _call(self, fn, values, **options):
        fmt = self._float_grid()
        scale, offset, qmin, qmax, axis = self._params()
        if fmt is not None:
            return float_call(fn.__name__, fmt, values, scale, axis, options.get("out"))
        try:
            if fn is numerics.dequantize:
                return fn(values, scale, offset, channel_axis=axis)
            return fn(values, scale, offset, qmin, qmax, self._rounding, channel_axis=axis, **options)
        except QuantizationStateError as exc:
            raise QuantizationStateError(f"{self._who()}: {exc}") from None

    def fake_quantize(self, x, out: np.ndarray | None = None, map_blocks=None) -> np.ndarray:
        """dequantize(quantize(x)) as float32 with the scale/offset in use (into ``out`` when given;
        ``out`` may be ``x``; ``map_blocks``: see ``numerics.fake_quantize``)."""
        return self._call(numerics.fake_quantize, x, map_blocks=map_blocks, **({} if out is None else {"out": out}))

    def fake_quantize_clipped(self, x, low, high, out: np.ndarray) -> np.ndarray:
        """fake_quantize(clip(x, low, high)) into ``out`` (a Relu/Clip before this per-tensor quantization;
        ``clipped_quantization``: one pass fewer where exact)."""
        return self.fake_quantizer(low, high, clipped=True)(x, out)

    def fake_quantizer(self, low=None, high=None, clipped: bool = False):
        """This per-tensor config's ``fake_quantize`` - or, ``clipped``, ``fake_quantize_clipped`` with these
        bounds - as a function ``(x, out)`` with its scale and checks resolved now (a kernel's epilogue
        calls it block after block, within one run)."""
        fmt = self._float_grid()
        scale, offset, qmin, qmax, _ = self._params()
        if fmt is not None:
            return float_fake_quantizer(fmt, scale, low, high, clipped)
        try:
            if clipped:
                return clipped_fake_quantizer(scale, offset, qmin, qmax, self._rounding, low, high)
            return numerics.fake_quantizer(scale, offset, qmin, qmax, self._rounding)
        except QuantizationStateError as exc:
            raise QuantizationStateError(f"{self._who()}: {exc}") from None

    def quantize_codes(self, x, map_blocks=None) -> np.ndarray | None:
        """q - Z as integer-valued float32 (``numerics.quantize_codes``: S times them is ``fake_quantize(x)``),
        or None where a per-tensor float32 quantization does not apply."""
        return self._call(numerics.quantize_codes, x, map_blocks=map_blocks)

    def quantize(self, x) -> np.ndarray:
        """Integers clamp(round(x / S) + Z) (int32, int64 for wide ranges)."""
        return self._call(numerics.quantize, x)

    def dequantize(self, q) -> np.ndarray:
        """Floats S * (q - Z) as float32."""
        return self._call(numerics.dequantize, q)

    # ------------------------------------------------------------- copy, JSON
    def copy(self) -> "TensorQuantizationConfig":
        """An independent config with the same values and state, linked to the same masters."""
        new = _copy.copy(self)
        new.detail = _copy.deepcopy(self.detail)
        return new
