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
