"""Calibration past one process: the batches sharded over Ray workers, the observers merged here.

``setting.calibration_backend = "ray"`` and ``setting.calibration_workers = N``: the driver reads the
calibration batches (through the dataloader, ``calib_steps`` and ``collate_fn`` as the local run does),
splits them into N contiguous shards and gives each to a Ray task that runs the executor with the
observers of every activation to calibrate (``calibration.observe_shard``).  The observers' fixed-size
states come back and are merged on the driver, in shard order.  Observer states merge exactly and in any
order (min/max; histograms over power-of-two ranges that re-bin exactly, see
``ppqlike.optim.observers.histogram``), so the scales equal the local run's bit for bit.

``ray.init`` is the user's: when Ray is already initialised its cluster is used; otherwise a local one with
N CPUs is started for the run (its workers import the same ppqlike as this process) and shut down after.
Workers run BLAS with this process's thread count: OpenBLAS's float results depend on it, and with another
count a few observed values (and the scales chosen from them) would differ in their last bits.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..core.errors import PlatformError
from ..core.ir import Graph

INSTALL_HINT = 'pip install "ppqlike[ray]" (or pip install ray)'


def require_ray():
    """The ``ray`` module, or PlatformError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise PlatformError(f"calibration_backend='ray' needs Ray, which is not installed; run `{INSTALL_HINT}`, "
                            "or use calibration_backend='local'") from None
    return ray


@dataclass
class ShardResults:
    """What the workers returned: one observer list per shard (in watched order), with each worker's time
    and memory."""

    observers: list[list]
    worker_seconds: list[float]
    worker_peak_mib: list[float]        # peak resident memory of each worker process (the OS's ru_maxrss)


def _observe_and_measure(graph: Graph, batches: list) -> tuple[list, float, float]:
    """One worker's task: its shard's observers, the seconds it took and the process's peak RSS (MiB)."""
    import resource
    import sys
    import time

    from .passes.calibration import observe_shard
    started = time.perf_counter()
    observers = observe_shard(graph, batches)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak_mib = peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024
    return observers, time.perf_counter() - started, peak_mib


def split_into_shards(batches: list, workers: int) -> list[list]:
    """``batches`` in ``workers`` contiguous, nearly equal shards (no empty shard)."""
    count = max(1, min(int(workers), len(batches)))
    size, extra = divmod(len(batches), count)
    shards, start = [], 0
    for index in range(count):
        end = start + size + (1 if index < extra else 0)
        shards.append(batches[start:end])
        start = end
    return [shard for shard in shards if shard]


def blas_threads_env() -> dict[str, str]:
    """OMP/OpenBLAS/MKL thread counts of this process, for the workers (Ray sets 1 per CPU otherwise)."""
    count = next((os.environ[name] for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
                  if os.environ.get(name, "").strip().isdigit()), str(os.cpu_count() or 1))
    return {name: count for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}


def _ppqlike_path() -> str:
    import ppqlike
    return os.path.dirname(os.path.dirname(os.path.abspath(ppqlike.__file__)))


def observe_on_ray(graph: Graph, batches: list, workers: int) -> ShardResults:
    """Run :func:`ppqlike.optim.passes.calibration.observe_shard` on ``workers`` Ray workers (see the module
    docstring); the driver keeps no executor state, only the batches it sends."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise PlatformError(f"calibration_workers must be a positive integer, got {workers!r}")
    ray = require_ray()
    shards = split_into_shards(batches, workers)
    started_here = not ray.is_initialized()
    if started_here:
        path = os.pathsep.join(p for p in (_ppqlike_path(), os.environ.get("PYTHONPATH")) if p)
        ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False, configure_logging=False,
                 runtime_env={"env_vars": {"PYTHONPATH": path}})
    try:
        # the workers' BLAS must use as many threads as this process: OpenBLAS splits its work by thread
        # count, and float results (hence the observed values, hence the scales) depend on it
        task = ray.remote(num_cpus=1, runtime_env={"env_vars": blas_threads_env()})(_observe_and_measure)
        graph_ref = ray.put(graph)
        results = ray.get([task.remote(graph_ref, shard) for shard in shards])
    finally:
        if started_here:
            ray.shutdown()
    return ShardResults([r[0] for r in results], [r[1] for r in results], [r[2] for r in results])
