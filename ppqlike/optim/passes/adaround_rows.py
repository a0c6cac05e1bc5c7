"""The rows AdaRound reconstructs from: each Conv/Gemm/MatMul's input rows at sampled output positions, kept as
rows or as their Gram matrix X^T X (memory bounded by K^2), and the weight layouts shared with the rounding
(``adaround.py``).  Weights are handled as [groups, out/group, K], the row layout of im2col; a MatMul's
weight [K, N] is a Gemm's without transB, its input rows the last axis of its first input."""

from __future__ import annotations

import numpy as np

from ...core.ir import Operation
from ...core.quant import TensorQuantizationConfig
from ...executor import OperationHook


#: the op types whose weight rounding is learned, and those of them that multiply rows by a matrix
ROUNDING_TYPES = frozenset({"Conv", "Gemm", "MatMul"})
MATRIX_TYPES = frozenset({"Gemm", "MatMul"})


# ------------------------------------------------------------------ layouts
def as_groups(operation: Operation, array: np.ndarray) -> np.ndarray:
    """A weight-shaped array as [groups, out/g, K] (the row layout of im2col)."""
    if operation.type in MATRIX_TYPES:
        matrix = array if operation.attributes.get("transB", 0) else array.T        # [out, K]
        return matrix[None]
    group = int(operation.attributes.get("group", 1))
    return array.reshape(group, array.shape[0] // group, -1)


def from_groups(operation: Operation, grouped: np.ndarray, shape: tuple) -> np.ndarray:
    if operation.type in MATRIX_TYPES:
        matrix = grouped[0]
        return matrix if operation.attributes.get("transB", 0) else matrix.T
    return grouped.reshape(shape)


def broadcast(config: TensorQuantizationConfig, values: np.ndarray, shape: tuple) -> np.ndarray:
    """A per-tensor or per-channel config parameter broadcast to the weight's shape (float64)."""
    values = np.asarray(values, dtype=np.float64)
    if values.ndim == 0:
        return np.full(shape, float(values))
    axis = config.channel_axis % len(shape)
    view = [1] * len(shape)
    view[axis] = -1
    return np.broadcast_to(values.reshape(view), shape).copy()


def conv_geometry(operation: Operation, weight: np.ndarray):
    attributes = operation.attributes
    auto_pad = attributes.get("auto_pad", "NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if weight.ndim != 4 or auto_pad not in ("NOTSET", "VALID"):
        return None
    pads = [int(v) for v in attributes.get("pads", [0, 0, 0, 0])] if auto_pad == "NOTSET" else [0, 0, 0, 0]
    strides = [int(v) for v in attributes.get("strides", [1, 1])]
    dilations = [int(v) for v in attributes.get("dilations", [1, 1])]
    return pads, strides, dilations


# ------------------------------------------------------------- statistics
class LayerStatistics:
    """The rows (while fewer than K) or the Gram matrix X^T X of one layer's input; memory bounded by K^2.

    The target is W x_q, so the error of a weight W~ is ||(W~ - W) x_q||^2 = tr(D G D^T), D = W~ - W.
    """

    def __init__(self, operation: Operation):
        self.name = operation.name                # (not the operation: statistics travel to workers alone)
        self.weight = as_groups(operation, operation.inputs[1].value.astype(np.float64))   # [G, O, K]
        self.groups, self.out, self.k = self.weight.shape
        self.rows = 0
        self.x_rows: list[np.ndarray] = []        # [G, r, K] chunks (row form)
        self.gram = None                          # [G, K, K]
        self._single = None                       # gram or rows in float32, for the gradient steps

    def add(self, x: np.ndarray) -> None:
        self.rows += x.shape[1]
        if self.gram is None:
            self.x_rows.append(x)
            if self.rows > self.k:
                self._to_gram()
        else:
            self.gram += np.matmul(x.transpose(0, 2, 1), x)

    def _to_gram(self) -> None:
        x = np.concatenate(self.x_rows, axis=1)
        self.gram = np.matmul(x.transpose(0, 2, 1), x)
        self.x_rows = []

    def _x(self) -> np.ndarray:
        x = np.concatenate(self.x_rows, axis=1)
        self.x_rows = [x]
        return x

    def finish(self) -> None:
        """Use the Gram form when it is the cheaper one for the optimization."""
        if self.gram is None and self.rows and 2 * self.rows > self.k:
            self._to_gram()

    def release(self) -> None:
        """Free the rows, the Gram matrix and their float32 copy (the layer is done; ``rows`` stays)."""
        self.x_rows, self.gram, self._single = [], None, None

    @property
    def nbytes(self) -> int:
        arrays = [self.gram, *self.x_rows]
        return int(sum(a.nbytes for a in arrays if a is not None))

    @property
    def energy(self) -> float:
        """||W x_q||^2 summed over the rows (the size of the output the error is compared with)."""
        return float(self.channel_errors(np.zeros_like(self.weight)).sum())

    def channel_errors(self, approx: np.ndarray) -> np.ndarray:
        """||(approx - W) x_q||^2 per output channel, [G, O]."""
        delta = approx - self.weight
        if self.gram is not None:
            return np.sum(np.matmul(delta, self.gram) * delta, axis=2)
        error = np.matmul(self._x(), delta.transpose(0, 2, 1))                    # [G, r, O]
        return np.sum(error * error, axis=1)

    def gradient(self, approx: np.ndarray) -> np.ndarray:
        """d loss / d approx in float32 (the optimization's steps; :meth:`loss` stays float64)."""
        if self._single is None:
            self._single = (self.gram if self.gram is not None else self._x()).astype(np.float32)
        delta = (approx - self.weight).astype(np.float32)
        if self.gram is not None:
            return np.matmul(delta, self._single) * np.float32(2.0 / self.rows)
        error = np.matmul(self._single, delta.transpose(0, 2, 1))                 # [G, r, O]
        return np.matmul(error.transpose(0, 2, 1), self._single) * np.float32(2.0 / self.rows)

    def loss(self, approx: np.ndarray) -> float:
        """The reconstruction loss per row of a weight ``approx`` [G, O, K], in float64 (it decides what is kept)."""
        return max(float(self.channel_errors(approx).sum()) / self.rows, 0.0)


class RowHook(OperationHook):
    """Samples ``per_batch`` output positions of each watched layer and adds the input rows they read."""

    def __init__(self, stats: dict[str, LayerStatistics], per_batch: int, seed: int):
        self.stats, self.per_batch = stats, per_batch
        self.rng = np.random.default_rng(seed)

    def before_operation(self, operation: Operation, inputs: list):
        stat = self.stats.get(operation.name)
        if stat is not None:
            x = np.asarray(inputs[0])
            stat.add(self.rows_at(operation, x, self.sample_positions(operation, x)))
        return None

    def sample_positions(self, operation: Operation, x: np.ndarray):
        """``per_batch`` output positions of ``operation`` on input ``x``, drawn without replacement."""
        if operation.type in MATRIX_TYPES:
            count = int(np.prod(x.shape[:-1]))
            return np.sort(self.rng.choice(count, size=min(count, self.per_batch), replace=False))
        pads, strides, dilations = conv_geometry(operation, operation.inputs[1].value)
        kh, kw = operation.inputs[1].value.shape[2:]
        out_h = (x.shape[2] + pads[0] + pads[2] - dilations[0] * (kh - 1) - 1) // strides[0] + 1
        out_w = (x.shape[3] + pads[1] + pads[3] - dilations[1] * (kw - 1) - 1) // strides[1] + 1
        total = x.shape[0] * out_h * out_w
        flat = self.rng.choice(total, size=min(total, self.per_batch), replace=False)
        n, rest = np.divmod(flat, out_h * out_w)
        return n, rest // out_w, rest % out_w

    @staticmethod
    def rows_at(operation: Operation, x: np.ndarray, indices) -> np.ndarray:
        """The sampled rows as [G, r, K] float64."""
        if operation.type in MATRIX_TYPES:
            return x.reshape(-1, x.shape[-1])[indices].astype(np.float64)[None]
        weight = operation.inputs[1].value
        group = int(operation.attributes.get("group", 1))
        kh, kw = weight.shape[2:]
        pads, strides, dilations = conv_geometry(operation, weight)
        n, oh, ow = indices
        padded = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
        rows_h = oh[:, None] * strides[0] + np.arange(kh)[None] * dilations[0]        # [r, kh]
        rows_w = ow[:, None] * strides[1] + np.arange(kw)[None] * dilations[1]        # [r, kw]
        patches = padded[n[:, None, None], :, rows_h[:, :, None], rows_w[:, None, :]]  # [r, kh, kw, C]
        patches = patches.transpose(0, 3, 1, 2).astype(np.float64)                     # [r, C, kh, kw]
        count, channels = patches.shape[:2]
        grouped = patches.reshape(count, group, channels // group * kh * kw)
        return grouped.transpose(1, 0, 2)                                              # [G, r, K]


class TargetStatistics:
    """One layer's reconstruction of its FP32 output from the input the quantized network feeds it (the
    sequential reconstruction, ``reconstruction.py``): the target is W x_f (x_f the FP32 input), the input
    x_m is the quantized input x_q where its quantization is kept and x_f where it is dropped, each element
    dropped with probability ``drop`` (QDrop), the error taken in expectation over the drops.  With
    D = W~ - W, A = (1 - drop) X_q + drop X_f (rows of the layer's input at the same positions):

        E||X_m W~^T - X_f W^T||^2 = tr(D G D^T) + 2 tr(D B^T) + sum_o c_o
        G = A^T A + diag(sum over rows of drop (1 - drop) (x_q - x_f)^2)       (= E[X_m^T X_m])
        B = W (G - X_f^T A),    c_o = w_o (G - X_f^T A - A^T X_f + X_f^T X_f) w_o^T

    so the gradient is 2 (D G + B) / rows.  The same interface as :class:`LayerStatistics` (which is the
    case x_q = x_f), so :func:`~.adaround_rounding.learn_rounding` optimizes either."""

    def __init__(self, operation: Operation, drop: float = 0.5):
        self.name = operation.name
        self.weight = as_groups(operation, operation.inputs[1].value.astype(np.float64))   # [G, O, K]
        self.groups, self.out, self.k = self.weight.shape
        self.drop, self.rows = float(drop), 0
        self.gram = np.zeros((self.groups, self.k, self.k))          # G
        self.cross = np.zeros((self.groups, self.k, self.k))         # X_f^T A
        self.float_gram = np.zeros((self.groups, self.k, self.k))    # X_f^T X_f
        self.offset = self.constant = self._single = None

    def add(self, quantized_rows: np.ndarray, float_rows: np.ndarray) -> None:
        """Rows [G, r, K] of the quantized and the FP32 input at the same positions."""
        mixed = (1.0 - self.drop) * quantized_rows + self.drop * float_rows
        spread = self.drop * (1.0 - self.drop) * np.sum((quantized_rows - float_rows) ** 2, axis=1)   # [G, K]
        float_t = float_rows.transpose(0, 2, 1)
        self.gram += np.matmul(mixed.transpose(0, 2, 1), mixed)
        self.gram[:, np.arange(self.k), np.arange(self.k)] += spread
        self.cross += np.matmul(float_t, mixed)
        self.float_gram += np.matmul(float_t, float_rows)
        self.rows += quantized_rows.shape[1]

    def finish(self) -> None:
        """B and c from the accumulated matrices (once, after the last rows)."""
        if self.offset is None:
            self.offset = np.matmul(self.weight, self.gram - self.cross)                          # [G, O, K]
            middle = self.gram - self.cross - self.cross.transpose(0, 2, 1) + self.float_gram
            self.constant = np.sum(np.matmul(self.weight, middle) * self.weight, axis=2)          # [G, O]

    def release(self) -> None:
        self.gram = self.cross = self.float_gram = self.offset = self._single = None

    @property
    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in (self.gram, self.cross, self.float_gram) if a is not None))

    @property
    def energy(self) -> float:
        """||W x_f||^2 summed over the rows."""
        return float(np.sum(np.matmul(self.weight, self.float_gram) * self.weight))

    def channel_errors(self, approx: np.ndarray) -> np.ndarray:
        """E||approx x_m - W x_f||^2 per output channel, [G, O]."""
        self.finish()
        delta = approx - self.weight
        return np.sum(np.matmul(delta, self.gram) * delta, axis=2) + 2.0 * np.sum(delta * self.offset, axis=2) \
            + self.constant

    def gradient(self, approx: np.ndarray) -> np.ndarray:
        """d loss / d approx in float32."""
        self.finish()
        if self._single is None:
            self._single = (self.gram.astype(np.float32), self.offset.astype(np.float32))
        gram, offset = self._single
        delta = (approx - self.weight).astype(np.float32)
        return (np.matmul(delta, gram) + offset) * np.float32(2.0 / self.rows)

    def loss(self, approx: np.ndarray) -> float:
        """The expected reconstruction loss per row of a weight ``approx`` [G, O, K], in float64."""
        return max(float(self.channel_errors(approx).sum()) / self.rows, 0.0)
