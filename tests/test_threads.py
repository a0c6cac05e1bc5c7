"""The kernels' thread pool (executor/ops/_threads.py): every job runs once, on at most the kernel threads
(the calling one among them), nested calls run inline, and a failing job's error reaches the caller."""

import threading
import time

import pytest

from ppqlike.executor.ops import _threads


@pytest.fixture
def three_threads():
    _threads.set_num_threads(3)
    yield
    _threads.set_num_threads(None)


def test_every_job_once_on_at_most_the_kernel_threads(three_threads):
    seen, lock = [], threading.Lock()

    def job(index):
        time.sleep(0.002)   # long enough that the helpers take some
        with lock:
            seen.append((index, threading.get_ident()))
    _threads.parallel(job, range(20))
    assert sorted(index for index, _ in seen) == list(range(20))
    assert len({ident for _, ident in seen}) <= 3
    assert threading.get_ident() in {ident for _, ident in seen}   # the caller works too


def test_items_with_one_workspace_per_thread(three_threads):
    made, done, lock = [], [], threading.Lock()

    def state():
        with lock:
            made.append(threading.get_ident())
        return threading.get_ident()

    def item(index, local):
        assert local == threading.get_ident()
        with lock:
            done.append(index)
    _threads.parallel_items(item, 50, state)
    assert sorted(done) == list(range(50))
    assert len(made) == len(set(made)) <= 3


def test_nested_calls_run_inline(three_threads):
    inner = []

    def job(_):
        caller = threading.get_ident()
        _threads.parallel(lambda k: inner.append(threading.get_ident() == caller), range(4))
    _threads.parallel(job, range(3))
    assert len(inner) == 12 and all(inner)


def test_a_failing_job_raises_after_the_others_finish(three_threads):
    finished = []

    def job(index):
        if index == 0:
            raise ValueError("job 0 failed")
        time.sleep(0.01)
        finished.append(index)
    with pytest.raises(ValueError, match="job 0 failed"):
        _threads.parallel(job, range(4))
    assert sorted(finished) == [1, 2, 3]


# ---------------------------------------------------- the defaults a user gets --
_PROBE = r"""
import json, os, numpy as np
from threadpoolctl import threadpool_info
from ppqlike.core.ir import Graph
from ppqlike.executor import NumpyExecutor, OperationHook, num_threads

def blas_threads():
    return [entry["num_threads"] for entry in threadpool_info() if entry["user_api"] == "blas"]

class Seen(OperationHook):
    def before_operation(self, operation, inputs):
        self.inside = blas_threads()

graph = Graph("probe")
x = graph.create_variable("x")
w = graph.create_variable("w", value=np.ones((8, 3), np.float32))
y = graph.create_variable("y")
graph.create_operation("MatMul", [x, w], [y], name="mm")
graph.inputs, graph.outputs = [x], [y]
before = blas_threads()
hook = Seen()
NumpyExecutor(graph).forward({"x": np.ones((4, 8), np.float32)}, hooks=[hook])
print(json.dumps({"kernel": num_threads(), "before": before, "inside": hook.inside, "after": blas_threads(),
                  "cores": len(os.sched_getaffinity(0))}))
"""


def _probe(**environment):
    import json
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS", "PPQLIKE_NUM_THREADS")}
    env.update(environment)
    done = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_plain_import_uses_every_usable_core_and_single_threaded_blas():
    seen = _probe()
    assert seen["kernel"] == seen["cores"]
    assert seen["inside"] and set(seen["inside"]) == {1}   # BLAS single-threaded while ppqlike computes
    assert seen["after"] == seen["before"]                # and the caller's setting restored after


def test_environment_variables_override():
    seen = _probe(OPENBLAS_NUM_THREADS="2")               # the user's BLAS setting is left alone
    assert seen["inside"] == seen["before"] and seen["kernel"] == 1
    seen = _probe(PPQLIKE_NUM_THREADS="3")
    assert seen["kernel"] == 3 and set(seen["inside"]) == {1}
    seen = _probe(OPENBLAS_NUM_THREADS="1", PPQLIKE_NUM_THREADS="2")
    assert seen["kernel"] == 2 and set(seen["inside"]) == {1}
