"""Threads: BLAS's pool and the kernels' own, set at run time from the cores this process may use.

Independent work (the images of a 1x1 convolution, depthwise images or
chunks, patch matrices, row blocks of a large MatMul, ConvTranspose phases,
pooling plane chunks, Softmax row blocks, blocks of multi-pass elementwise
functions such as Erf, requantization chunks) runs on the kernel threads
(numpy, einsum and BLAS release the GIL), while BLAS itself runs
single-threaded (:func:`computing_threads`, through threadpoolctl).  On 2-vCPU
machines that was the fastest setting measured (depthwise layers about 25%
faster than a two-thread OpenBLAS, 1x1 layers about as fast, and no collapse
when another process takes a core, which OpenBLAS's spin-waiting threads
suffer), and it keeps results the same bits whatever the thread count:
OpenBLAS cuts some products (matrix x vector) by its thread count.

Defaults, so that a plain ``import ppqlike`` is the fast configuration: as
many kernel threads as ``os.sched_getaffinity`` gives this process, BLAS at
one thread while ppqlike computes (the caller's setting is restored after).
Environment variables override: ``PPQLIKE_NUM_THREADS`` sets the kernel
threads; ``OPENBLAS_NUM_THREADS`` (or ``MKL_NUM_THREADS``,
``OMP_NUM_THREADS``) leaves BLAS as the user set it, with one kernel thread
unless ``PPQLIKE_NUM_THREADS`` says otherwise.  :func:`set_num_threads`
changes the kernel threads at run time.

The calling thread works beside T - 1 pool threads, each taking the next job
when free.  Two rules for the kernels: how work is cut must not depend on the
thread count (OpenBLAS's sums depend on the cuts, and the scales on the
sums), and a job should be numpy calls of well over ten microseconds (two
threads doing shorter calls wait on each other for the GIL and gain nothing).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

from threadpoolctl import ThreadpoolController

_POOL: ThreadPoolExecutor | None = None
_POOL_SIZE = 0
_POOL_LOCK = threading.Lock()
_NUM_THREADS: int | None = None
_INSIDE = threading.local()   # .job: this thread is running a job of parallel()
#: the variables by which a user sets BLAS's threads, the first set one wins
BLAS_VARIABLES = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS")
_BLAS = {"controller": None, "depth": 0, "limit": None}
_BLAS_LOCK = threading.Lock()


def _positive_integer(text: str | None) -> int | None:
    text = (text or "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS tells it, else the machine's)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def blas_threads_from_environment() -> int | None:
    """BLAS's thread count as the user set it in the environment (None: not set, ppqlike chooses)."""
    return next((count for count in (_positive_integer(os.environ.get(name)) for name in BLAS_VARIABLES)
                 if count is not None), None)


def _default_threads() -> int:
    chosen = _positive_integer(os.environ.get("PPQLIKE_NUM_THREADS"))
    if chosen is not None:
        return chosen
    blas = blas_threads_from_environment()
    return usable_cores() if blas is None or blas == 1 else 1


def num_threads() -> int:
    """Threads the kernels share their independent work among (BLAS has its own setting)."""
    global _NUM_THREADS
    if _NUM_THREADS is None:
        _NUM_THREADS = _default_threads()
    return _NUM_THREADS


def set_num_threads(count: int | None) -> None:
    """Use ``count`` kernel threads (None: back to the default)."""
    global _NUM_THREADS
    _NUM_THREADS = None if count is None else max(1, int(count))


@contextmanager
def computing_threads():
    """While ppqlike computes: BLAS single-threaded (its parallel work is on the kernel threads), unless the
    environment sets BLAS's threads.  Re-entrant and shared by concurrent callers: the first to enter limits
    BLAS, the last to leave restores what the caller had."""
    if blas_threads_from_environment() is not None:
        yield
        return
    with _BLAS_LOCK:
        if _BLAS["depth"] == 0:
            if _BLAS["controller"] is None:
                _BLAS["controller"] = ThreadpoolController()
            _BLAS["limit"] = _BLAS["controller"].limit(limits=1, user_api="blas")
        _BLAS["depth"] += 1
    try:
        yield
    finally:
        with _BLAS_LOCK:
            _BLAS["depth"] -= 1
            if _BLAS["depth"] == 0:
                _BLAS["limit"].restore_original_limits()
                _BLAS["limit"] = None


def parallel(function, jobs) -> None:
    """Run ``function(job)`` for every job: the calling thread and up to T - 1 pool threads each take the
    next job whenever free (inline when there is one job or thread, or inside a job already)."""
    jobs = list(jobs)
    threads = min(num_threads(), len(jobs))
    if threads <= 1 or getattr(_INSIDE, "job", False):
        for job in jobs:
            function(job)
        return
    global _POOL, _POOL_SIZE
    with _POOL_LOCK:
        if _POOL is None or _POOL_SIZE < threads - 1:
            if _POOL is not None:
                _POOL.shutdown(wait=False)
            _POOL = ThreadPoolExecutor(max_workers=threads - 1, thread_name_prefix="ppqlike-conv")
            _POOL_SIZE = threads - 1
        pool = _POOL
    pending = iter(jobs)   # a list iterator's next() is atomic under the GIL

    def work():
        _INSIDE.job = True
        try:
            for job in pending:
                function(job)
        finally:
            _INSIDE.job = False
    helpers = [pool.submit(work) for _ in range(threads - 1)]
    failure = None
    try:
        work()
    except BaseException as error:   # let the helpers finish before raising
        failure = error
    for helper in helpers:
        try:
            helper.result()
        except BaseException as error:
            failure = failure or error
    if failure is not None:
        raise failure


def parallel_over(function, items, threads: int | None = None) -> None:
    """Call ``function(item)`` for every item of the sequence ``items`` on ``threads`` threads (default: the
    kernel threads), each taking the next item whenever it is free (``parallel_items``)."""
    parallel_items(lambda index, _: function(items[index]), len(items), threads=threads)


def parallel_items(function, count: int, state=None, threads: int | None = None) -> None:
    """Call ``function(item, local)`` for every item of ``range(count)``: each of ``threads`` threads (default:
    the kernel threads) takes the next item whenever it is free (so they finish within one item of each
    other), with ``local`` made once per thread by ``state()`` (a workspace; None without ``state``).
    Which thread takes an item must not change what the item computes."""
    items = iter(range(count))   # a range iterator's next() is atomic under the GIL

    def work(_):
        local, made = None, state is None
        for item in items:
            if not made:   # lazily: a thread that finds no item left makes none
                local, made = state(), True
            function(item, local)
    parallel(work, range(max(1, min(num_threads() if threads is None else threads, count))))


def split_evenly(count: int, parts: int) -> list[tuple[int, int]]:
    """``range(count)`` cut into at most ``parts`` contiguous, non-empty, balanced pieces."""
    parts = max(1, min(parts, count))
    bounds = [count * i // parts for i in range(parts + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(parts) if bounds[i + 1] > bounds[i]]


# ---------------------------------------------------------------- pointwise --
