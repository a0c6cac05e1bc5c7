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
Workers compute as this process does (``executor.ops._threads``): BLAS single-threaded, unless the user set
its threads in the environment, which the workers then get too (OpenBLAS's float results depend on its thread
count); each worker has its share of this process's kernel threads, which change no result.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..core.errors import PlatformError
from ..core.ir import Graph
from ..executor.ops._threads import BLAS_VARIABLES, blas_threads_from_environment, num_threads

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


def _observe_and_measure(graph: Graph, batches: list, observe) -> tuple[list, float, float]:
    """One worker's task: ``observe(graph, batches)`` (its shard's observers), the seconds it took and the
    process's peak RSS (MiB)."""
    import resource
    import sys
    import time

    started = time.perf_counter()
    observers = observe(graph, batches)
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


def observe_on_ray(graph: Graph, batches: list, workers: int, observe) -> ShardResults:
    """Run ``observe(graph, shard)`` (the calibration pass's ``observe_shard``: a module-level function, which
    Ray sends by name) on ``workers`` Ray workers (see the module docstring); the driver keeps no executor
    state, only the batches it sends."""
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
        task = ray.remote(num_cpus=1, runtime_env={"env_vars": worker_threads_env(workers)})(_observe_and_measure)
        graph_ref = ray.put(graph)
        results = ray.get([task.remote(graph_ref, shard, observe) for shard in shards])
    finally:
        if started_here:
            ray.shutdown()
    return ShardResults([r[0] for r in results], [r[1] for r in results], [r[2] for r in results])
