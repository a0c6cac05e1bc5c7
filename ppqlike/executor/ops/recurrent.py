"""Kernels of the recurrent family: LSTM, GRU and RNN (opset 7; opset 14 adds ``layout``).

Every attribute of the ONNX text is honoured: ``direction`` (forward, reverse,
bidirectional), ``activations`` with ``activation_alpha``/``activation_beta``
(:mod:`._recurrent_activations`), ``clip`` (bounds every gate's input to the
activation), ``input_forget`` (LSTM: f = 1 - i), ``linear_before_reset``
(GRU), ``layout`` (1: batch first), and the optional inputs B, sequence_lens,
initial_h, initial_c and the peepholes P.

Gate orders are ONNX's: LSTM i, o, f, c; GRU z, r, h.  The input projection
X W^T + Wb (+ Rb where the gate adds it unconditionally) is one matmul over
all time steps and gates; the recurrence then runs step by step, the batch and
the gates of a step in one matmul.  With ``sequence_lens`` a sequence's
steps past its length leave its state alone and write zeros to Y; a reverse
direction starts at the sequence's last valid step; Y_h / Y_c are the states
after the last valid step, and zeros for a sequence of length 0 (as
onnxruntime computes, whatever the initial state).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...core.errors import ExecutionError
from ._recurrent_activations import bind_activations
from .base import Kernel, attribute, by_opset, unsupported

#: gates per op type, and the default activations of one direction
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
_DEFAULT_ACTIVATIONS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh"), "RNN": ("Tanh",)}
_DIRECTIONS = {"forward": (False,), "reverse": (True,), "bidirectional": (False, True)}
#: optional input slots: B, sequence_lens, initial_h, initial_c, P
_B, _LENS, _H0, _C0, _P = 3, 4, 5, 6, 7


@dataclass(frozen=True)
class _Cell:
    """What one op computes, parsed from its attributes once."""

    op_type: str
    hidden: int
    reverse: tuple            # per direction: runs backwards in time
    activations: tuple        # per direction: the tuple of its activation functions (f, g, h / f, g / f)
    clip: float | None
    input_forget: bool
    linear_before_reset: bool
    batch_first: bool
    outputs: int


def _parse(op, has_layout: bool) -> _Cell:
    op_type = op.type
    hidden = int(attribute(op, "hidden_size"))
    if hidden <= 0:
        raise unsupported(op, f"hidden_size {hidden} (must be positive)")
    direction = attribute(op, "direction", "forward")
    direction = direction.decode() if isinstance(direction, bytes) else str(direction)
    if direction not in _DIRECTIONS:
        raise unsupported(op, f"direction {direction!r} (forward, reverse or bidirectional)")
    reverse = _DIRECTIONS[direction]
    per_direction = len(_DEFAULT_ACTIVATIONS[op_type])
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in attribute(op, "activations", [])]
    if not names:
        names = list(_DEFAULT_ACTIVATIONS[op_type]) * len(reverse)
    elif op_type == "RNN" and len(reverse) == 1 and len(names) == 2:
        names = names[:1]   # RNN's schema default lists two; onnxruntime takes the first
    if len(names) != per_direction * len(reverse):
        raise unsupported(op, f"{len(names)} activations for {len(reverse)} direction(s); {op_type} takes "
                              f"{per_direction} per direction")
    bound = bind_activations(names, list(attribute(op, "activation_alpha", [])),
                             list(attribute(op, "activation_beta", [])))
    if isinstance(bound, str):
        raise unsupported(op, bound)
    activations = tuple(tuple(bound[d * per_direction:(d + 1) * per_direction]) for d in range(len(reverse)))
    clip = attribute(op, "clip", None)
    if clip is not None and not float(clip) > 0:
        raise unsupported(op, f"clip {clip} (must be positive)")
    layout = int(attribute(op, "layout", 0)) if has_layout else 0
    if layout not in (0, 1):
        raise unsupported(op, f"layout {layout} (0: sequence first, 1: batch first)")
    return _Cell(op_type, hidden, reverse, activations, None if clip is None else float(clip),
                 bool(attribute(op, "input_forget", 0)) if op_type == "LSTM" else False,
                 bool(attribute(op, "linear_before_reset", 0)) if op_type == "GRU" else False,
                 layout == 1, len(op.outputs))


def _optional(inputs, index: int):
    return inputs[index] if len(inputs) > index else None


def _check_shapes(op, cell: _Cell, x, w, r, b, lens, h0, c0, p) -> None:
    """An ExecutionError naming the op and the input whose shape disagrees with the ONNX text."""
    steps, batch, size = x.shape
    rows, hidden, directions = _GATES[cell.op_type] * cell.hidden, cell.hidden, len(cell.reverse)
    expected = {"W": (w, (directions, rows, size)), "R": (r, (directions, rows, hidden)),
                "B": (b, (directions, 2 * rows)), "sequence_lens": (lens, (batch,)),
                "initial_h": (h0, (directions, batch, hidden)), "initial_c": (c0, (directions, batch, hidden)),
                "P": (p, (directions, 3 * hidden))}
    for name, (value, shape) in expected.items():
        if value is not None and tuple(value.shape) != shape:
            raise ExecutionError(f"{op.type} node {op.name!r}: input {name} has shape {list(value.shape)}, "
                                 f"expected {list(shape)} (sequence-first view; hidden_size {hidden})")
    if lens is not None and lens.size and (lens.min() < 0 or lens.max() > steps):
        raise ExecutionError(f"{op.type} node {op.name!r}: sequence_lens {lens.tolist()} must lie in "
                             f"[0, {steps}] (the sequence length of X)")


def _clipped(x: np.ndarray, clip: float | None) -> np.ndarray:
    return x if clip is None else np.clip(x, -clip, clip, out=x)


def _lstm_step(cell: _Cell, acts, gates, h, c, r_t, peep):
    """One LSTM step: ``gates`` holds X W^T + Wb + Rb for the step (modified here)."""
    hidden = cell.hidden
    gates += h @ r_t
    i, o, f, g = (gates[:, k * hidden:(k + 1) * hidden] for k in range(4))
    if peep is not None:
        i += peep[0] * c
        f += peep[2] * c
    i = acts[0](_clipped(i, cell.clip))
    f = 1 - i if cell.input_forget else acts[0](_clipped(f, cell.clip))
    c_new = f * c + i * acts[1](_clipped(g, cell.clip))
    if peep is not None:
        o += peep[1] * c_new
    h_new = acts[0](_clipped(o, cell.clip)) * acts[2](c_new)
    return h_new, c_new


def _gru_step(cell: _Cell, acts, gates, h, c, r_t, recurrent_bias):
    """One GRU step: ``gates`` holds X W^T + Wb (+ Rb for z and r, and for h unless linear_before_reset)."""
    hidden = cell.hidden
    gates[:, :2 * hidden] += h @ r_t[:, :2 * hidden]
    z = acts[0](_clipped(gates[:, :hidden], cell.clip))
    reset = acts[0](_clipped(gates[:, hidden:2 * hidden], cell.clip))
    candidate = gates[:, 2 * hidden:]
    if cell.linear_before_reset:
        linear = h @ r_t[:, 2 * hidden:]
        if recurrent_bias is not None:
            linear += recurrent_bias
        candidate += reset * linear
    else:
        candidate += (reset * h) @ r_t[:, 2 * hidden:]
    candidate = acts[1](_clipped(candidate, cell.clip))
    return (1 - z) * candidate + z * h, c


def _rnn_step(cell: _Cell, acts, gates, h, c, r_t, unused):
    gates += h @ r_t
    return acts[0](_clipped(gates, cell.clip)), c


_STEPS = {"LSTM": _lstm_step, "GRU": _gru_step, "RNN": _rnn_step}


def _projection(cell: _Cell, x, w, b):
    """X W^T plus the biases added at every step, [T, batch, gates * hidden], and the bias that the step
    adds itself (GRU's Rbh with linear_before_reset), or None."""
    projected = x @ w.T
    if b is None:
        return projected, None
    rows = _GATES[cell.op_type] * cell.hidden
    w_bias, r_bias = b[:rows], b[rows:]
    if cell.linear_before_reset:
        projected += w_bias
        projected[..., :2 * cell.hidden] += r_bias[:2 * cell.hidden]
        return projected, r_bias[2 * cell.hidden:]
    projected += w_bias + r_bias
    return projected, None


def _run_direction(cell: _Cell, d: int, x, w, r, b, lengths, h, c, p):
    """One direction over all steps: Y [T, batch, hidden], the final h and c."""
    steps, batch = x.shape[:2]
    projected, step_bias = _projection(cell, x, w, b)
    r_t = np.ascontiguousarray(r.T)
    extra = step_bias if cell.op_type == "GRU" else (None if p is None else p.reshape(3, 1, cell.hidden))
    step_function, acts = _STEPS[cell.op_type], cell.activations[d]
    y = np.zeros((steps, batch, cell.hidden), dtype=x.dtype)
    if lengths is not None and cell.reverse[d]:
        # step t of sequence n reads input len(n) - 1 - t: each sequence reversed within its own length
        index = lengths[None, :] - 1 - np.arange(steps)[:, None]
        projected = projected[np.maximum(index, 0), np.arange(batch)[None, :]]
    elif cell.reverse[d]:
        projected = projected[::-1]
    for t in range(steps):
        with np.errstate(over="ignore", invalid="ignore"):   # an unbounded cell overflows as onnxruntime's does
            h_new, c_new = step_function(cell, acts, projected[t], h, c, r_t, extra)
        if lengths is None:
            h, c = h_new, c_new
            y[t] = h
            continue
        valid = (t < lengths)[:, None]
        h = np.where(valid, h_new, h)
        if cell.op_type == "LSTM":
            c = np.where(valid, c_new, c)
        y[t] = np.where(valid, h_new, 0)
    if lengths is not None:
        if cell.reverse[d]:
            index = lengths[None, :] - 1 - np.arange(steps)[:, None]
            y = np.where((index >= 0)[..., None], y[np.maximum(index, 0), np.arange(batch)[None, :]], 0)
        empty = (lengths == 0)[:, None]
        h = np.where(empty, 0, h).astype(x.dtype, copy=False)
        c = np.where(empty, 0, c).astype(x.dtype, copy=False)
    elif cell.reverse[d]:
        y = y[::-1]
    return y, h, c


def _build(op, has_layout: bool) -> Kernel:
    cell = _parse(op, has_layout)
    directions = len(cell.reverse)

    def kernel(inputs):
        x, w, r = inputs[0], inputs[1], inputs[2]
        b, lens, h0 = _optional(inputs, _B), _optional(inputs, _LENS), _optional(inputs, _H0)
        c0 = _optional(inputs, _C0) if cell.op_type == "LSTM" else None
        p = _optional(inputs, _P) if cell.op_type == "LSTM" else None
        if x.ndim != 3:
            raise ExecutionError(f"{op.type} node {op.name!r}: X has rank {x.ndim}, expected 3")
        if cell.batch_first:
            x = x.transpose(1, 0, 2)
            h0 = None if h0 is None else h0.transpose(1, 0, 2)
            c0 = None if c0 is None else c0.transpose(1, 0, 2)
        lengths = None if lens is None else np.asarray(lens, dtype=np.int64)
        _check_shapes(op, cell, x, w, r, b, lengths, h0, c0, p)
        steps, batch = x.shape[:2]
        if lengths is not None and np.all(lengths == steps):
            lengths = None
        dtype = x.dtype
        zeros = np.zeros((batch, cell.hidden), dtype=dtype)
        ys, hs, cs = [], [], []
        for d in range(directions):
            y, h, c = _run_direction(
                cell, d, x, w[d].astype(dtype, copy=False), r[d].astype(dtype, copy=False),
                None if b is None else b[d].astype(dtype, copy=False), lengths,
                zeros if h0 is None else h0[d].astype(dtype), zeros if c0 is None else c0[d].astype(dtype),
                None if p is None else p[d].astype(dtype, copy=False))
            ys.append(y)
            hs.append(h)
            cs.append(c)
        y, y_h, y_c = np.stack(ys, axis=1), np.stack(hs), np.stack(cs)   # [T, D, batch, H], [D, batch, H]
        if cell.batch_first:
            y, y_h, y_c = y.transpose(2, 0, 1, 3), y_h.transpose(1, 0, 2), y_c.transpose(1, 0, 2)
        outputs = [np.ascontiguousarray(y), np.ascontiguousarray(y_h)]
        if cell.op_type == "LSTM":
            outputs.append(np.ascontiguousarray(y_c))
        return outputs[:cell.outputs]
    return kernel


def _build_7(op, opset: int) -> Kernel:
    """LSTM-7, GRU-7, RNN-7: sequence first."""
    return _build(op, has_layout=False)


def _build_14(op, opset: int) -> Kernel:
    """LSTM-14, GRU-14, RNN-14 (and 22, the same with more types): ``layout`` 1 is batch first."""
    return _build(op, has_layout=True)


KERNELS: dict = {op_type: by_opset({7: _build_7, 14: _build_14}) for op_type in _GATES}
