"""The pass interface, the pipeline that runs passes in order, and the pass registry.

A pass is an object with a ``name`` and one ``optimize`` method.  The pipeline
hands every pass the same keyword arguments (graph, executor, dataloader,
calib_steps, collate_fn); a pass uses what it needs and ignores the rest.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

from tqdm.auto import tqdm

from ..core.compat import tolerant_collate
from ..core.declared_names import refuse_unknown_keywords
from ..core.errors import CalibrationDataError, PlatformError
from ..core.ir import Graph
from ..executor import computing_threads
from .distributed import workers_session


class QuantizationOptimizationPass:
    """Base class of every pass.  Subclasses set ``name`` and override ``optimize``.

    ``optimize`` edits the graph's configs in place and may return a dict of
    facts to report (counts, errors); the pipeline records it.

    Constructing a pass with a keyword its ``__init__`` does not take raises UnknownKeywordError naming the
    closest one; a constructor with ``**kwargs`` is checked against its named parameters and
    ``accepted_keywords`` (PPQ's options that change nothing here), unless that is None.
    """

    name: str = "pass"
    #: the keywords a constructor's ``**kwargs`` takes besides its named parameters (None: any)
    accepted_keywords: tuple[str, ...] | None = None

    def __new__(cls, *args: Any, **kwargs: Any):
        refuse_unknown_keywords(cls.__init__, kwargs, f"{cls.__name__}()", cls.accepted_keywords)
        return super().__new__(cls)

    def optimize(self, graph: Graph, executor: Any = None, dataloader: Iterable | None = None,
                 calib_steps: int | None = None, collate_fn: Callable | None = None,
                 **kwargs: Any) -> dict | None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<pass {self.name}>"


class TimeBudget:
    """Seconds shared by the passes of one pipeline run; the clock starts at ``started`` (quantize_onnx_model
    gives the time it was called, so the budget is the whole quantization's), else when the first pass asks.

    ``TimeBudget(None)`` never runs out.  Passes call :meth:`deadline` when they start and stop their
    optional work at that ``time.perf_counter()`` value, keeping what they have done.
    """

    def __init__(self, seconds: float | None = None, parent: "TimeBudget | None" = None,
                 started: float | None = None):
        if seconds is not None and seconds < 0:
            raise PlatformError(f"a time budget must be None or at least 0 seconds, got {seconds}")
        self.seconds = seconds
        self.started: float | None = started   # a perf_counter() value: the clock started then (None: not yet)
        self.parent = parent

    def part(self, fraction: float) -> "TimeBudget":
        """A budget of ``fraction`` of these seconds on the same clock (a pass that must leave time to
        later ones); the later ones still have until this budget's own deadline."""
        return TimeBudget(None if self.seconds is None else self.seconds * fraction, parent=self)

    @classmethod
    def of(cls, value: "TimeBudget | float | None") -> "TimeBudget":
        """``value`` itself when it is a TimeBudget, else a new one of ``value`` seconds."""
        return value if isinstance(value, TimeBudget) else cls(value)

    def deadline(self) -> float:
        """The perf_counter() value at which the budget is spent (inf without a budget)."""
        if self.seconds is None:
            return float("inf")
        if self.parent is not None:
            return self.parent.start() + self.seconds
        return self.start() + self.seconds

    def start(self) -> float:
        """When the clock started (now, if nobody asked before)."""
        if self.parent is not None:
            return self.parent.start()
        if self.started is None:
            self.started = time.perf_counter()
        return self.started

    def __repr__(self) -> str:
        return f"TimeBudget({self.seconds})"


@dataclass
class PassRecord:
    """What one pass did in a pipeline run: its name, seconds taken and report."""

    name: str
    seconds: float
    report: dict = field(default_factory=dict)


class QuantizationOptimizationPipeline:
    """An ordered list of passes, run one after another, each timed."""

    def __init__(self, passes: Sequence[QuantizationOptimizationPass]):
        self.passes = list(passes)
        self.records: list[PassRecord] = []

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.passes]

    def index(self, name: str) -> int:
        """Position of the pass called ``name``; PlatformError listing the names if absent."""
        for position, existing in enumerate(self.passes):
            if existing.name == name:
                return position
        raise PlatformError(f"no pass named {name!r} in the pipeline; its passes are {self.names}")

    def insert(self, new_pass: QuantizationOptimizationPass, before: str | None = None,
               after: str | None = None) -> None:
        """Place ``new_pass`` before or after the pass named so (at the end when neither is given)."""
        if before is not None and after is not None:
            raise PlatformError("give either before= or after=, not both")
        if before is not None:
            self.passes.insert(self.index(before), new_pass)
        elif after is not None:
            self.passes.insert(self.index(after) + 1, new_pass)
        else:
            self.passes.append(new_pass)

    def optimize(self, graph: Graph, verbose: int = 0, **kwargs: Any) -> list[PassRecord]:
        """Run every pass on ``graph``; returns (and keeps) one record per pass.  BLAS runs single-threaded
        meanwhile (its parallel work on the kernel threads), so results do not depend on the thread count."""
        self.records = []
        if kwargs.get("calib_steps") is not None and kwargs.get("calib_steps") > 0:  # repeated once for all passes
            kwargs["dataloader"] = repeat_to_steps(kwargs.get("dataloader"), kwargs["calib_steps"])
        with computing_threads(), workers_session():   # passes using Ray share its workers
            for current in self.passes:
                started = time.perf_counter()
                report = current.optimize(graph, **kwargs) or {}
                record = PassRecord(current.name, time.perf_counter() - started, dict(report))
                self.records.append(record)
                if verbose:
                    print(f"[ppqlike] {record.name:<28s} {record.seconds:7.2f}s  {_summary(record.report)}")
        return self.records


def _summary(report: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in report.items() if isinstance(v, (int, float, str)))


class PassRegistry:
    """User passes to add to pipelines, each placed before or after a named built-in pass.

    A registry is an ordinary object: ``ppqlike.register_pass`` adds to the
    default one that ``quantize_onnx_model`` reads; nothing registers itself
    at import time.
    """

    def __init__(self):
        self._entries: list[tuple[QuantizationOptimizationPass, str | None, str | None]] = []

    def register(self, new_pass: QuantizationOptimizationPass, before: str | None = None,
                 after: str | None = None) -> QuantizationOptimizationPass:
        if not isinstance(new_pass, QuantizationOptimizationPass):
            raise PlatformError(f"{new_pass!r} is not a QuantizationOptimizationPass instance")
        if before is not None and after is not None:
            raise PlatformError("give either before= or after=, not both")
        self._entries.append((new_pass, before, after))
        return new_pass

    def unregister(self, new_pass: QuantizationOptimizationPass) -> None:
        self._entries = [entry for entry in self._entries if entry[0] is not new_pass]

    def clear(self) -> None:
        self._entries.clear()

    def apply(self, pipeline: QuantizationOptimizationPipeline) -> QuantizationOptimizationPipeline:
        """Insert every registered pass into ``pipeline`` (in registration order)."""
        for new_pass, before, after in self._entries:
            pipeline.insert(new_pass, before=before, after=after)
        return pipeline

    def __len__(self) -> int:
        return len(self._entries)


DEFAULT_PASS_REGISTRY = PassRegistry()


def register_pass(new_pass: QuantizationOptimizationPass, before: str | None = None,
                  after: str | None = None) -> QuantizationOptimizationPass:
    """Add a user pass to every pipeline ``quantize_onnx_model`` builds, before or after a named pass."""
    return DEFAULT_PASS_REGISTRY.register(new_pass, before=before, after=after)


class CalibrationRepeatWarning(UserWarning):
    """``calib_steps`` asked for more batches than the dataloader holds: it is run again (one line)."""


class RepeatedBatches:
    """A re-iterable dataloader run again and again until ``steps`` batches are drawn, as PPQ's
    RuntimeCalibrationPass does (``ceil(steps / len(dataloader))`` epochs, stopping at ``steps``)."""

    def __init__(self, dataloader: Iterable, steps: int):
        self.dataloader, self.steps = dataloader, int(steps)

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[Any]:
        drawn = 0
        while drawn < self.steps:
            epoch = 0
            for batch in self.dataloader:
                yield batch
                drawn, epoch = drawn + 1, epoch + 1
                if drawn >= self.steps:
                    return
            if epoch == 0:  # empty: the caller says so
                return

    def calibration_shard(self, start: int, stop: int):
        """Batches ``start`` to ``stop`` (exclusive) as readers of their own files (see
        ``ppqlike.optim.distributed.file_shards``), or None when the dataloader's are not."""
        shard = getattr(self.dataloader, "calibration_shard", None)
        available = len(self.dataloader)
        if shard is None or available <= 0:
            return None
        pieces, index = [], start
        while index < stop:   # batch i is batch i % available of the dataloader
            first = index % available
            last = min(available, first + stop - index)
            pieces.append(shard(first, last))
            index += last - first
        return None if any(p is None for p in pieces) else ChainedShards(pieces)


class ChainedShards:
    """Several calibration shards read one after the other (picklable when they are)."""

    def __init__(self, shards: list):
        self.shards = list(shards)

    def __len__(self) -> int:
        return sum(len(shard) for shard in self.shards)

    def __iter__(self) -> Iterator[Any]:
        for shard in self.shards:
            yield from shard


class CollatedShard:
    """A calibration shard's batches through ``collate_fn`` (the pipeline's; None: as they are), as
    :func:`iterate_calibration` hands them to the passes; picklable when the shard and collate_fn are."""

    def __init__(self, shard: Iterable, collate_fn: Callable | None):
        self.shard, self.collate_fn = shard, tolerant_collate(collate_fn)

    def __len__(self) -> int:
        return len(self.shard)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        for batch in self.shard:
            yield self.collate_fn(batch) if self.collate_fn is not None else batch


def repeat_to_steps(dataloader: Any, calib_steps: int | None) -> Any:
    """``dataloader``, or a :class:`RepeatedBatches` over it when it holds fewer than ``calib_steps`` batches
    (its length known, and iterating it twice gives the batches twice); the repeat is said in one
    :class:`CalibrationRepeatWarning` line.  An empty, unsized or one-shot dataloader is returned as it is
    (iterating it says what is wrong)."""
    if calib_steps is None or dataloader is None or isinstance(dataloader, RepeatedBatches):
        return dataloader
    try:
        available = len(dataloader)
    except TypeError:
        return dataloader
    if available <= 0 or available >= calib_steps or iter(dataloader) is dataloader:
        return dataloader
    epochs = math.ceil(calib_steps / available)
    warnings.warn(f"calib_steps is {calib_steps} but the dataloader holds {available} batches: it is run "
                  f"{epochs} times for {calib_steps} batches, as PPQ does (give more data, or calib_steps="
                  f"{available}, to calibrate on distinct batches only)", CalibrationRepeatWarning, stacklevel=3)
    return RepeatedBatches(dataloader, calib_steps)


def iterate_calibration(dataloader: Iterable, calib_steps: int | None = None,
                        collate_fn: Callable | None = None, description: str = "calibration",
                        verbose: bool = True) -> Iterator[Any]:
    """Yield up to ``calib_steps`` batches of ``dataloader`` (through ``collate_fn``) with a tqdm bar.

    A re-iterable dataloader shorter than ``calib_steps`` is run again until the steps are done (one
    warning line, :func:`repeat_to_steps`); an empty dataloader, or a one-shot one that runs out before
    ``calib_steps``, is a CalibrationDataError.
    """
    if dataloader is None:
        raise CalibrationDataError(f"{description} needs calibration data, but no dataloader was given")
    collate_fn = tolerant_collate(collate_fn)  # PPQ's device moves on numpy batches are skipped
    total = calib_steps
    if total is None:
        try:
            total = len(dataloader)  # type: ignore[arg-type]
        except TypeError:
            total = None
    elif total <= 0:
        raise CalibrationDataError(f"calib_steps must be positive, got {calib_steps}")
    else:
        dataloader = repeat_to_steps(dataloader, calib_steps)
    seen = 0
    # disable=None: no bar when stderr is not a terminal (a log file), where bars and lines would run together
    with tqdm(total=total, desc=description, unit="batch", disable=None if verbose else True, leave=False) as bar:
        for batch in dataloader:
            if calib_steps is not None and seen >= calib_steps:
                break
            yield collate_fn(batch) if collate_fn is not None else batch
            seen += 1
            bar.update(1)
    if seen == 0:
        raise CalibrationDataError("the calibration dataloader yielded no batch")
    if calib_steps is not None and seen < calib_steps:
        raise CalibrationDataError(
            f"calib_steps is {calib_steps} but the dataloader yielded only {seen} batches and cannot be run "
            f"again (a generator or iterator); lower calib_steps to at most {seen} or give a list of batches")
