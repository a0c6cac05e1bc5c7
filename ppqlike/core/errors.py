"""One exception hierarchy for everything ppqlike raises on purpose.

Every error names what is at fault (file, op, tensor) and, where possible,
what would fix it.  Catch :class:`PPQLikeError` to catch them all.
"""


class PPQLikeError(Exception):
    """Base class of every error ppqlike raises deliberately."""


class ModelLoadError(PPQLikeError):
    """An ONNX file could not be read or is not a valid model."""


class GraphError(PPQLikeError):
    """The graph is inconsistent: dangling inputs, cycles, bad edits."""


class UnsupportedOperationError(PPQLikeError):
    """An operation type (or an attribute value) the executor cannot run."""


class ExecutionError(PPQLikeError):
    """Running the graph failed: missing inputs, wrong shapes, a kernel error."""


class QuantizationStateError(PPQLikeError):
    """An illegal quantization-state transition or an unusable config."""


class QuantizationPolicyError(PPQLikeError):
    """A quantization policy whose flags contradict each other."""


class CalibrationDataError(PPQLikeError):
    """Calibration data is empty, malformed, or holds NaN/Inf."""


class PlatformError(PPQLikeError):
    """An unknown platform, dispatcher or setting."""


class ExportError(PPQLikeError):
    """A model or config could not be exported, or the destination is unusable."""


class UnknownSettingError(PlatformError, AttributeError):
    """A setting, option or attribute that the object does not define (a misspelling, or another tool's
    name), refused before anything runs; the message names it and the closest valid names.  An
    AttributeError too, as Python's own would be."""


class UnknownKeywordError(UnknownSettingError, TypeError):
    """A keyword option that a constructor or function does not take (a TypeError too, as Python's own)."""


class UnknownExportOptionError(UnknownKeywordError, ExportError):
    """An export option that the exporters do not take."""
