"""Calibration sharded over workers: observer states merge exactly (any split, any order), and the Ray backend
on a local 2-worker cluster writes the same config JSON as the local backend on a shared model."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import ppqlike
from ppqlike.core.errors import PlatformError
from ppqlike.optim.distributed import require_ray, split_into_shards
from shared_bench import PRESETS, load_images, requires_bench
from test_observers import ALGORITHMS, observer


@settings(max_examples=40, deadline=None)
@given(algorithm=st.sampled_from(ALGORITHMS), per_channel=st.booleans(), seed=st.integers(0, 2 ** 16),
       batches=st.integers(1, 7), workers=st.integers(1, 4), reverse=st.booleans())
def test_merged_observer_states_equal_the_single_stream(algorithm, per_channel, seed, batches, workers, reverse):
    if algorithm == "search" and per_channel:
        per_channel = False  # the search observer is per tensor
    rng = np.random.default_rng(seed)
    scales = rng.uniform(0.01, 100, batches)
    data = [(rng.standard_t(3, size=(2, 3, 20)) * s).astype(np.float32) for s in scales]
    kwargs = dict(per_channel=per_channel, axis=1 if per_channel else None)
    single = observer(algorithm, **kwargs)
    for batch in data:
        single.observe(batch)
    shards = split_into_shards(data, workers)
    assert [b for shard in shards for b in shard] == data and len(shards) == min(workers, batches)
    parts = []
    for shard in shards:
        part = observer(algorithm, **kwargs)
        for batch in shard:
            part.observe(batch)
        parts.append(part)
    merged = observer(algorithm, **kwargs)
    for part in (reversed(parts) if reverse else parts):
        merged.merge(part)
    np.testing.assert_array_equal(merged.thresholds(), single.thresholds())
    for mine, theirs in zip(merged._state_arrays(), single._state_arrays()):
        np.testing.assert_array_equal(mine, theirs)
    assert merged.num_batches == single.num_batches == batches


def test_missing_ray_says_how_to_install(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(PlatformError, match=r'pip install "ppqlike\[ray\]"'):
        require_ray()


def test_backend_setting_is_validated():
    with pytest.raises(PlatformError, match="calibration_backend"):
        ppqlike.QuantizationSetting(calibration_backend="spark")
    with pytest.raises(PlatformError, match="calibration_workers"):
        ppqlike.QuantizationSetting(calibration_workers=0)


@requires_bench
@pytest.mark.real_model
def test_ray_backend_gives_the_local_backends_config_json():
    pytest.importorskip("ray", reason="the ray extra is not installed (pip install \".[ray]\"); CI installs it")
    from ppqlike.export.config_json import config_to_json
    images, _, _ = load_images("mobilenetv2", "calib", 12)
    batches = [images[i:i + 3] for i in range(0, 12, 3)]
    written = {}
    for backend in ("local", "ray"):
        setting = ppqlike.QuantizationSettingFactory.for_platform("TPU_INT8")  # KL: histograms are merged
        setting.calibration_backend, setting.calibration_workers = backend, 2
        graph = ppqlike.quantize_onnx_model(str(PRESETS["mobilenetv2"].path), batches, platform="TPU_INT8",
                                            setting=setting)
        calibration = next(p for p in graph.metadata["quantization"]["passes"] if p["name"] == "calibration")
        assert calibration["report"]["backend"] == backend
        document = config_to_json(graph)
        written[backend] = {k: json.dumps(document[k], sort_keys=True) for k in ("configs", "parameters")}
    for key in ("configs", "parameters"):  # (compared whole: a failure does not print megabytes of diff)
        assert (written["ray"][key] == written["local"][key]) is True, key
