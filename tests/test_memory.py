"""Freed memory kept between forwards (issue 17): on glibc, once an executor exists, a batch's freed arrays
are reused by the next one without the OS clearing their pages again; PPQLIKE_KEEP_FREED_MEMORY=0 leaves
the allocator alone."""

import os
import platform
import subprocess
import sys

import pytest

import ppqlike

_PROBE = r"""
import resource, sys
import numpy as np
import ppqlike
from ppqlike.executor import memory
graph = ppqlike.load_onnx_graph(sys.argv[1])
ppqlike.NumpyExecutor(graph)                   # creating an executor sets the allocator up
faults = []
for _ in range(4):                             # batches: 24 MiB arrays made, filled and freed
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    arrays = [np.ones(3 << 20) for _ in range(4)]
    del arrays
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(memory.keep_freed_memory(), min(faults[1:]))
"""


def _probe(tmp_path, keep: str) -> tuple[bool, int]:
    from onnx_helpers import single_node_model
    import numpy as np
    import onnx
    model = single_node_model("Relu", {"x": np.zeros((1, 4), np.float32)})
    path = tmp_path / "relu.onnx"
    onnx.save(model, str(path))
    environment = dict(os.environ, PPQLIKE_KEEP_FREED_MEMORY=keep)
    result = subprocess.run([sys.executable, "-c", _PROBE, str(path)], capture_output=True, text=True,
                            env=environment, check=True, cwd=os.path.dirname(os.path.dirname(ppqlike.__file__)))
    kept, faults = result.stdout.split()
    return kept == "True", int(faults)


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_freed_arrays_are_reused_without_page_faults(tmp_path):
    kept, faults = _probe(tmp_path, "1")
    assert kept
    assert faults < 100                        # 96 MiB reallocated: ~24,000 faults (or ~48 huge ones) if returned
    left_alone, faults_default = _probe(tmp_path, "0")
    assert not left_alone
    assert faults_default > 2 * faults
