"""Work past one process: what is expensive, on Ray workers, with the local run's results bit for bit.

``setting.calibration_backend = "ray"`` and ``setting.calibration_workers = N`` send two kinds of work to N
Ray workers:

* **Calibration** (``calibration.observe_shard``): the calibration batches in N contiguous shards, one Ray task
  each, observing every activation to calibrate.  When the data comes from files (a dataloader with a
  ``calibration_shard(start, stop)`` method: :class:`ppqlike.io.calibration_data.CalibrationFolder` and the
  wrappers the API and the pipeline put around it), a shard goes as its list of files and the loader that
  reads them, and each worker reads its own files; batches held in memory (a list of arrays) go as arrays.
  The observers' fixed-size states come back and merge exactly, in any order (min/max; histograms over
  power-of-two ranges that re-bin exactly, see ``ppqlike.optim.observers.histogram``).
* **Independent measurements of the accuracy passes** (:func:`map_items`): a module-level function over
  items (the units of the accuracy target's sensitivity ranking, its trial moves, the tensors of the
  threshold search, the layers of learned rounding with their gathered statistics), each result a function of its item and of what is shared (the graph and the data), so
  the items can be split over workers in any way.

Bits.  A worker runs the same code on a copy of the same graph and data as this process, with BLAS
single-threaded as here (``executor.ops._threads``: unless the user set BLAS's threads in the environment,
which the workers then get too, since OpenBLAS's float results depend on its thread count); each worker has
its share of this process's kernel threads, which change no result.

Workers.  ``ray.init`` is the user's: when Ray is already initialised its cluster is used; otherwise a local
one with N CPUs is started (its workers import the same ppqlike as this process).  Inside
:func:`workers_session` (a whole pipeline) the passes share it and it is shut down at the end; outside one,
after each call.  A task whose worker process dies (killed, out of memory) is run again by Ray, up to
``MAX_RETRIES`` times: tasks are pure functions of what they are sent, so the result is the same bits.

The cost model (how wall time falls with N): ``docs/SCALE.md``.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..core.errors import PlatformError
from ..executor.ops._threads import BLAS_VARIABLES, blas_threads_from_environment, computing_threads, num_threads

INSTALL_HINT = 'pip install "ppqlike[ray]" (or pip install ray)'
BACKENDS = ("local", "ray")
#: how many times Ray runs a task again whose worker process died
MAX_RETRIES = 3


def require_ray():
    """The ``ray`` module, or PlatformError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise PlatformError(f"calibration_backend='ray' needs Ray, which is not installed; run `{INSTALL_HINT}`, "
                            "or use calibration_backend='local'") from None
    return ray


def check_workers(workers) -> int:
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise PlatformError(f"calibration_workers must be a positive integer, got {workers!r}")
    return workers


def split_into_shards(batches: Sequence, workers: int) -> list:
    """``batches`` in ``workers`` contiguous, nearly equal shards (no empty shard)."""
    count = max(1, min(int(workers), len(batches)))
    size, extra = divmod(len(batches), count)
    shards, start = [], 0
    for index in range(count):
        end = start + size + (1 if index < extra else 0)
        shards.append(batches[start:end])
        start = end
    return [shard for shard in shards if len(shard)]


def strided_chunks(count: int, workers: int) -> list[list[int]]:
    """Indices 0..count-1 dealt round-robin into ``workers`` chunks (no empty chunk): neighbouring items
    (an early layer with a long way downstream, then the next) go to different workers."""
    parts = max(1, min(int(workers), count))
    return [list(range(start, count, parts)) for start in range(parts) if start < count]


def longest_first_chunks(costs: Sequence[float], workers: int) -> list[list[int]]:
    """Indices 0..len(costs)-1 in up to ``workers`` chunks of nearly equal total cost: the costliest item first
    to the chunk with the least so far (ties: the lower index, the lower chunk); each chunk in index order."""
    parts = max(1, min(int(workers), len(costs)))
    chunks: list[list[int]] = [[] for _ in range(parts)]
    totals = [0.0] * parts
    for index in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        lightest = min(range(parts), key=lambda c: (totals[c], c))
        chunks[lightest].append(index)
        totals[lightest] += costs[index]
    return [sorted(chunk) for chunk in chunks if chunk]


def worker_threads_env(workers: int) -> dict[str, str]:
    """The thread variables of the workers: this process's BLAS setting where the user made one (Ray sets
    OMP_NUM_THREADS=1 otherwise, which is what ppqlike's kernels use anyway), and each worker's share of the
    kernel threads."""
    blas = blas_threads_from_environment()
    kernel = {"PPQLIKE_NUM_THREADS": str(max(1, num_threads() // max(1, workers)))}
    return kernel if blas is None else {**kernel, **{name: str(blas) for name in BLAS_VARIABLES}}


def _ppqlike_path() -> str:
    import ppqlike
    return os.path.dirname(os.path.dirname(os.path.abspath(ppqlike.__file__)))


# ------------------------------------------------------------------ the Ray runtime of a session
_SESSION = {"depth": 0, "started": False}


def _start_ray(workers: int):
    """Ray, initialised: the user's cluster when there is one, else a local one with ``workers`` CPUs (marked
    as started here).  Returns (ray, whether this call started it)."""
    ray = require_ray()
    if ray.is_initialized():
        return ray, False
    path = os.pathsep.join(p for p in (_ppqlike_path(), os.environ.get("PYTHONPATH")) if p)
    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    if _SESSION["depth"]:
        _SESSION["started"] = True
        return ray, False   # the session shuts it down
    return ray, True


@contextmanager
def workers_session():
    """While inside (a whole pass pipeline): a Ray runtime started by a pass stays up for the next passes,
    whose tasks then find its workers warm; it is shut down on leaving.  Re-entrant; costs nothing when no
    pass uses Ray."""
    _SESSION["depth"] += 1
    try:
        yield
    finally:
        _SESSION["depth"] -= 1
        if _SESSION["depth"] == 0 and _SESSION["started"]:
            _SESSION["started"] = False
            require_ray().shutdown()


# ------------------------------------------------------------------ mapping work over workers
@dataclass
class MappedResults:
    """``results``: one per item, in the items' order; per task (one per worker used): its seconds and its
    worker's peak resident memory (MiB, the OS's ru_maxrss); empty when run locally."""

    results: list
    worker_seconds: list[float] = field(default_factory=list)
    worker_peak_mib: list[float] = field(default_factory=list)

    def report(self) -> dict:
        """What the pass reports about the workers (nothing when run locally)."""
        if not self.worker_seconds:
            return {}
        return {"workers": len(self.worker_seconds),
                "worker_seconds": [round(t, 3) for t in self.worker_seconds],
                "worker_peak_mib": [round(m, 1) for m in self.worker_peak_mib]}


def _run_chunk(function: Callable, shared: Any, chunk: list) -> tuple[list, float, float]:
    """One Ray task: ``function(shared, chunk)`` under the thread settings of this process's passes, its
    seconds and the process's peak RSS (MiB)."""
    import resource
    import sys
    import time

    started = time.perf_counter()
    with computing_threads():
        results = list(function(shared, chunk))
    if len(results) != len(chunk):
        raise PlatformError(f"{function.__qualname__} returned {len(results)} results for {len(chunk)} items")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak_mib = peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024
    return results, time.perf_counter() - started, peak_mib


def map_items(function: Callable, shared: Any, items: Sequence, backend: str = "local", workers: int = 1,
              chunks: list[list[int]] | None = None) -> MappedResults:
    """``function(shared, chunk)`` -> one result per item of ``chunk``, over all ``items``; the results in the
    items' order.

    ``function`` is a module-level function (Ray sends it by name) whose result for an item depends only on
    the item and on ``shared`` (which it leaves as it found it), so any split gives the same results:
    'local' calls it once on all items in this process; 'ray' deals the items into ``chunks`` (index lists;
    by default :func:`strided_chunks` over ``workers``) and runs one Ray task per chunk, ``shared`` sent once
    to the object store (and read once per task).
    """
    items = list(items)
    if backend not in BACKENDS:
        raise PlatformError(f"backend {backend!r} is unknown; choose one of {list(BACKENDS)}")
    if backend == "local" or not items:
        return MappedResults(list(function(shared, items)) if items else [])
    check_workers(workers)
    chunks = strided_chunks(len(items), workers) if chunks is None else [c for c in chunks if c]
    ray, started_here = _start_ray(workers)
    try:
        task = ray.remote(num_cpus=1, max_retries=MAX_RETRIES,
                          runtime_env={"env_vars": worker_threads_env(workers)})(_run_chunk)
        shared_ref = ray.put(shared)
        outcomes = ray.get([task.remote(function, shared_ref, [items[i] for i in chunk]) for chunk in chunks])
    finally:
        if started_here:
            ray.shutdown()
    results: list = [None] * len(items)
    for chunk, (chunk_results, _, _) in zip(chunks, outcomes):
        for index, result in zip(chunk, chunk_results):
            results[index] = result
    return MappedResults(results, [o[1] for o in outcomes], [o[2] for o in outcomes])


# ------------------------------------------------------------------ calibration shards
def file_shards(dataloader: Any, steps: int | None, workers: int) -> list | None:
    """The first ``steps`` batches of ``dataloader`` (all when None) as up to ``workers`` contiguous shards,
    each a picklable re-iterable that reads its own batches (``dataloader.calibration_shard(start, stop)``);
    None when the dataloader cannot be sharded so (batches in memory, an unknown length)."""
    shard = getattr(dataloader, "calibration_shard", None)
    if shard is None:
        return None
    try:
        total = len(dataloader)
    except TypeError:
        return None
    total = total if steps is None else min(total, steps)
    if total <= 0:
        return None
    ranges = split_into_shards(range(total), workers)
    shards = [shard(r.start, r.stop) for r in ranges]
    return None if any(s is None for s in shards) else shards


def observe_on_ray(graph, shards: list, workers: int, observe: Callable) -> MappedResults:
    """``observe(graph, [shard])`` (the calibration pass's ``observe_shard``) for each shard (a list of
    batches, or a reader of its own files), one Ray task per shard; one observer list per shard comes back."""
    check_workers(workers)
    return map_items(observe, graph, shards, "ray", workers, chunks=[[i] for i in range(len(shards))])
