"""The twelve quantization states and the table of legal transitions (DESIGN.md §3).

:data:`STATE_TRANSITIONS` is the single source of truth; the state setter of
:class:`ppqlike.core.quant.TensorQuantizationConfig` checks every change
against it.  Two exits bypass the table on purpose: ``restore()`` (which
leaves DEQUANTIZED for exactly the state it came from) and ``reset()``
(back to INITIAL from anywhere, SOI included).
"""

from __future__ import annotations

import enum

__all__ = [
    "QuantizationStates", "STATE_TRANSITIONS", "DEQUANTIZABLE_STATES", "GOVERNED_STATES",
    "is_applied", "is_baked", "is_governed", "is_dequantizable", "can_transition",
]


class QuantizationStates(enum.Enum):
    """Life cycle of one TensorQuantizationConfig; values are the names (JSON)."""

    INITIAL = "INITIAL"              #: created by the quantizer; not yet usable
    ACTIVATED = "ACTIVATED"          #: own scale/offset, applied at run time
    BAKED = "BAKED"                  #: parameter quantized once and stored; not applied again
    OVERLAPPED = "OVERLAPPED"        #: activation governed by another TQC; not applied itself
    SLAVE = "SLAVE"                  #: shares its master's scale/offset and is applied
    DEACTIVATED = "DEACTIVATED"      #: switched off; the tensor stays float
    DEQUANTIZED = "DEQUANTIZED"      #: temporarily float; the previous state is restored later
    SOI = "SOI"                      #: shape or index: never quantized
    PASSIVE = "PASSIVE"              #: scale from other configs (bias, clip, pad), applied
    PASSIVE_INIT = "PASSIVE_INIT"    #: passive, scale not yet known
    PASSIVE_BAKED = "PASSIVE_BAKED"  #: passive and baked into the stored value
    FP32 = "FP32"                    #: runs in float on purpose (CPU fallback, mixed precision)


S = QuantizationStates

#: States from which the executor's dequantize context may switch a config off
#: (every state whose quantization is in effect, baked values included: the
#: executor swaps the float value back in for BAKED/PASSIVE_BAKED).
DEQUANTIZABLE_STATES = frozenset({S.ACTIVATED, S.BAKED, S.SLAVE, S.PASSIVE, S.PASSIVE_BAKED})

#: States in which a config may hang on master configs.
GOVERNED_STATES = frozenset({S.OVERLAPPED, S.SLAVE, S.PASSIVE, S.PASSIVE_INIT, S.PASSIVE_BAKED})

#: state -> states it may move to.  Reasoning, row by row:
#:
#: * INITIAL: the dispatcher sends it to FP32/SOI; fusion and simplify to
#:   OVERLAPPED; the parameter/calibration passes to ACTIVATED (or straight to
#:   BAKED); alignment to SLAVE; the quantizer/passive pass to
#:   PASSIVE_INIT/PASSIVE; the user to DEACTIVATED.
#: * ACTIVATED: recalibration (-> ACTIVATED), baking, late fusion/simplify
#:   (OVERLAPPED), alignment (SLAVE), analysis (DEQUANTIZED), switching off
#:   (DEACTIVATED) and fallback (FP32).
#: * BAKED / PASSIVE_BAKED: the stored value is already quantized and the float
#:   original is gone from the config, so only DEQUANTIZED (analysis; the
#:   executor swaps the float value back in) is allowed.
#: * OVERLAPPED: re-pointed to another master (-> OVERLAPPED), promoted to
#:   SLAVE, released to ACTIVATED (with its own parameters) or INITIAL (to be
#:   calibrated), or the op falls back (FP32/DEACTIVATED).  Not DEQUANTIZED:
#:   it applies nothing, its master is the one to dequantize.
#: * SLAVE: re-aligned (-> SLAVE), released to ACTIVATED or INITIAL, demoted to
#:   OVERLAPPED, DEQUANTIZED, DEACTIVATED, FP32.
#: * DEACTIVATED / FP32: switched back on (ACTIVATED needs own parameters),
#:   back to INITIAL for a new calibration, or to each other.
#: * DEQUANTIZED: back to the state it came from (enforced by the config: only
#:   that one of this row is accepted).
#: * SOI: terminal; only an explicit ``reset()`` leaves it.
#: * PASSIVE_INIT: the passive pass makes it PASSIVE; fallback FP32/DEACTIVATED.
#: * PASSIVE: recomputed (-> PASSIVE), baked, DEQUANTIZED, FP32, DEACTIVATED.
STATE_TRANSITIONS: dict[QuantizationStates, frozenset[QuantizationStates]] = {
    S.INITIAL: frozenset({S.ACTIVATED, S.BAKED, S.OVERLAPPED, S.SLAVE, S.PASSIVE_INIT, S.PASSIVE,
                          S.DEACTIVATED, S.FP32, S.SOI}),
    S.ACTIVATED: frozenset({S.ACTIVATED, S.BAKED, S.OVERLAPPED, S.SLAVE, S.DEQUANTIZED,
                            S.DEACTIVATED, S.FP32}),
    S.BAKED: frozenset({S.DEQUANTIZED}),
    S.OVERLAPPED: frozenset({S.OVERLAPPED, S.SLAVE, S.ACTIVATED, S.INITIAL, S.DEACTIVATED, S.FP32}),
    S.SLAVE: frozenset({S.SLAVE, S.OVERLAPPED, S.ACTIVATED, S.INITIAL, S.DEQUANTIZED,
                        S.DEACTIVATED, S.FP32}),
    S.DEACTIVATED: frozenset({S.ACTIVATED, S.INITIAL, S.FP32}),
    S.DEQUANTIZED: DEQUANTIZABLE_STATES,
    S.SOI: frozenset(),
    S.PASSIVE: frozenset({S.PASSIVE, S.PASSIVE_BAKED, S.DEQUANTIZED, S.DEACTIVATED, S.FP32}),
    S.PASSIVE_INIT: frozenset({S.PASSIVE, S.DEACTIVATED, S.FP32}),
    S.PASSIVE_BAKED: frozenset({S.DEQUANTIZED}),
    S.FP32: frozenset({S.ACTIVATED, S.INITIAL, S.DEACTIVATED}),
}


def can_transition(current: QuantizationStates, new: QuantizationStates) -> bool:
    """Whether the table allows ``current -> new``."""
    return new in STATE_TRANSITIONS[current]


def is_applied(state: QuantizationStates) -> bool:
    """The executor fake-quantizes the tensor: ACTIVATED, SLAVE, PASSIVE."""
    return state in (S.ACTIVATED, S.SLAVE, S.PASSIVE)


def is_baked(state: QuantizationStates) -> bool:
    """The stored value is already quantized: BAKED, PASSIVE_BAKED."""
    return state in (S.BAKED, S.PASSIVE_BAKED)


def is_governed(state: QuantizationStates) -> bool:
    """The config may take its scale from masters: OVERLAPPED, SLAVE, PASSIVE*."""
    return state in GOVERNED_STATES


def is_dequantizable(state: QuantizationStates) -> bool:
    """``set_dequantized()`` is legal from this state."""
    return state in DEQUANTIZABLE_STATES
