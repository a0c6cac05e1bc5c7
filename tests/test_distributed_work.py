"""Work on Ray workers gives the local run's bits: calibration shards read by the workers from the calibration
files, the accuracy passes' independent measurements mapped over workers, and a worker killed mid-task
retried by Ray.  The Ray tests share one local 2-worker cluster (started once for the module)."""

from __future__ import annotations

import json
import os
import pickle
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import ppqlike
from ppqlike.core.errors import CalibrationDataError
from ppqlike.api import _CheckedBatches
from ppqlike.optim.batch_range import BatchRange
from ppqlike.io.calibration_data import CalibrationFolder
from ppqlike.io.calibration_files import CalibrationFileLoader
from ppqlike.optim.base import RepeatedBatches
from ppqlike.optim.distributed import file_shards, longest_first_chunks, map_items, strided_chunks
from shared_bench import BENCH_DIR, PRESETS, requires_bench

RAY_ABSENT = "the ray extra is not installed (pip install \".[ray]\"); CI installs it"


def _arrays_folder(root, counts: list[int], seed: int):
    """A folder of .npy files holding ``counts`` samples each (a single sample stored without a batch axis)."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for index, count in enumerate(counts):
        values = rng.standard_normal((max(count, 1), 2, 3)).astype(np.float32)
        np.save(root / f"f{index:02d}.npy", values[0] if count == 1 else values)
    return root


def _flat(batches) -> list[np.ndarray]:
    return [np.asarray(b) for b in batches]


def _assert_same_batches(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------ shards of calibration files (no Ray)
@settings(max_examples=25, deadline=None)
@given(counts=st.lists(st.integers(1, 5), min_size=1, max_size=6), batch_size=st.integers(1, 4),
       workers=st.integers(1, 4), seed=st.integers(0, 1000))
def test_file_shards_hold_the_folders_batches_and_pickle(tmp_path_factory, counts, batch_size, workers, seed):
    folder = CalibrationFolder(_arrays_folder(tmp_path_factory.mktemp("d"), counts, seed), {"x": ["N", 2, 3]},
                               batch_size=batch_size)
    whole = _flat(folder)
    shards = file_shards(folder, None, workers)
    assert len(shards) == min(workers, len(whole))
    _assert_same_batches([b for s in shards for b in _flat(pickle.loads(pickle.dumps(s)))], whole)
    # a shard names only the files its batches are read from
    assert all(set(s.files) <= set(folder.files) for s in shards)
    assert sum(len(s.files) for s in shards) <= len(folder.files) + len(shards) - 1
    # the wrappers the pipeline and the API put around the folder shard as they iterate
    repeated = RepeatedBatches(folder, len(whole) * 2 + 1)
    _assert_same_batches([b for s in file_shards(repeated, None, workers) for b in _flat(s)], _flat(repeated))
    ranged = BatchRange(folder, 1, len(whole)) if len(whole) > 1 else BatchRange(folder, 0, 1)
    _assert_same_batches([b for s in file_shards(ranged, 2, workers) for b in _flat(s)], _flat(ranged)[:2])
    graph = SimpleNamespace(name="m", inputs=[SimpleNamespace(name="x", shape=["N", 2, 3])])
    checked = _CheckedBatches(graph, folder, None, None, None)
    got = [b["x"] for s in file_shards(checked, None, workers) for b in pickle.loads(pickle.dumps(s))]
    _assert_same_batches(got, whole)


def test_batches_in_memory_are_not_sharded_as_files():
    assert file_shards([np.zeros((1, 2))] * 3, None, 2) is None
    assert file_shards(RepeatedBatches([np.zeros((1, 2))], 3), None, 2) is None


def test_a_shard_reports_a_bad_batch_with_its_index_in_the_users_data(tmp_path):
    folder = _arrays_folder(tmp_path / "d", [2, 2, 2], 0)
    graph = SimpleNamespace(name="m", inputs=[SimpleNamespace(name="x", shape=["N", 2, 4])])   # 3 != 4
    shard = file_shards(_CheckedBatches(graph, CalibrationFolder(folder, {"x": ["N", 2, 3]}, batch_size=2),
                                        None, None, None), None, 3)[2]
    with pytest.raises(CalibrationDataError, match=r"calibration batch 2: .*'x' must have shape"):
        list(shard)


def test_strided_chunks_deal_every_item_once():
    assert strided_chunks(7, 3) == [[0, 3, 6], [1, 4], [2, 5]]
    assert strided_chunks(2, 5) == [[0], [1]]


def _square_all(offset, items):
    return [offset + item * item for item in items]


@settings(max_examples=50, deadline=None)
@given(costs=st.lists(st.floats(0, 1e6), max_size=30), workers=st.integers(1, 5))
def test_longest_first_chunks_deal_every_item_once_and_balance(costs, workers):
    chunks = longest_first_chunks(costs, workers)
    assert sorted(i for chunk in chunks for i in chunk) == list(range(len(costs)))
    assert all(chunk == sorted(chunk) and chunk for chunk in chunks) and len(chunks) <= workers
    if chunks:   # greedy longest-first: no chunk exceeds the lightest by more than its costliest item
        totals = [sum(costs[i] for i in chunk) for chunk in chunks]
        assert max(totals) - min(totals) <= max(costs) * (1 + 1e-9) + 1e-9
    assert longest_first_chunks([1.0, 5.0, 2.0, 2.0], 2) == [[1], [0, 2, 3]]


def test_a_rounding_job_carries_its_deadline_as_wall_time_and_stops_at_it():
    import pickle as pickle_
    import time
    from ppqlike.optim.passes.adaround_rounding import RoundingJob, round_layers
    soon = time.perf_counter() + 100.0
    job = pickle_.loads(pickle_.dumps(RoundingJob(graph=None, wall_deadline=RoundingJob.wall_time_of(soon))))
    assert abs(job.deadline() - soon) < 0.05
    assert RoundingJob(graph=None).deadline() == float("inf")
    past = RoundingJob(graph=None, wall_deadline=RoundingJob.wall_time_of(time.perf_counter() - 1.0))
    assert round_layers(past, [("a", None), ("b", None)]) == [None, None]   # no layer begun


def test_map_items_locally_is_one_call_in_order():
    mapped = map_items(_square_all, 1, [3, 1, 2])
    assert mapped.results == [10, 2, 5] and mapped.report() == {}


# ------------------------------------------------------------------ on a local 2-worker Ray cluster
#: the file whose absence makes a worker's task kill its process (see _dies_once_observing)
DIE_MARKER = "PPQLIKE_TEST_DIE_MARKER"


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    ray = pytest.importorskip("ray", reason=RAY_ABSENT)
    from ppqlike.optim.distributed import _ppqlike_path
    path = os.pathsep.join(p for p in (_ppqlike_path(), os.path.dirname(__file__), os.environ.get("PYTHONPATH"))
                           if p)
    marker = str(tmp_path_factory.mktemp("ray") / "died")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": {"PYTHONPATH": path, DIE_MARKER: marker}})
    yield SimpleNamespace(ray=ray, marker=marker)
    ray.shutdown()


def _image_folder(tmp_path, count: int):
    """``count`` of the shared calibration images, linked into a folder of their own."""
    folder = tmp_path / "calib"
    folder.mkdir()
    source = os.path.join(BENCH_DIR, "images", "calib")
    for name in sorted(os.listdir(source))[:count]:
        os.symlink(os.path.join(source, name), folder / name)
    return folder


def _configs(graph) -> dict:
    from ppqlike.export.config_json import config_to_json
    document = config_to_json(graph)
    return {k: json.dumps(document[k], sort_keys=True) for k in ("configs", "parameters")}


def _report(graph, name: str) -> dict:
    return next(p for p in graph.metadata["quantization"]["passes"] if p["name"] == name)["report"]


@requires_bench
@pytest.mark.real_model
def test_workers_read_their_own_calibration_files(ray_cluster, tmp_path, monkeypatch):
    """SqueezeNet on 8 images from a folder, batches of 2 (the last held aside): the Ray backend's configs are
    the local backend's, and this process read only the first calibration batch's images (the workers the
    others)."""
    preset = PRESETS["squeezenet1.1"]
    folder = _image_folder(tmp_path, 8)
    read = []
    original = CalibrationFileLoader.image
    monkeypatch.setattr(CalibrationFileLoader, "image", lambda self, name: (read.append(name), original(self, name))[1])
    written, reads = {}, {}
    for backend in ("local", "ray"):
        graph = ppqlike.load_onnx_graph(str(preset.path))
        data = CalibrationFolder(folder, graph, batch_size=2,
                                 image_options={"mean": (103.94, 116.78, 123.68), "bgr": True})
        setting = ppqlike.QuantizationSettingFactory.for_platform("TPU_INT8")
        setting.activation_observer = "kl"   # histograms, merged (no choice between observers on the driver)
        setting.calibration_backend, setting.calibration_workers = backend, 2
        read.clear()
        graph = ppqlike.quantize_onnx_model(str(preset.path), data, platform="TPU_INT8", setting=setting)
        written[backend], reads[backend] = _configs(graph), len(read)
        report = _report(graph, "calibration")
        assert report["backend"] == backend
    assert report["workers"] == 2 and report["shards_read_by_workers"] is True
    # calibration sees 3 batches of 2 (the 4th is held aside): locally each image is read once; on Ray this
    # process reads the first batch (for the observer choice) and the held-aside one, the workers the others;
    # then bias correction, which runs here, reads the calibration batches it measures (its 16 samples: all 3)
    assert (reads["local"], reads["ray"]) == (8, 4 + 6)
    for key in ("configs", "parameters"):
        assert (written["ray"][key] == written["local"][key]) is True, key


def _quantized_twice(model, batches, platform: str, recipe: str = "balanced", **changes) -> dict:
    """backend -> (graph, its configs JSON, its outputs on the first batch) for 'local' and 'ray'."""
    results = {}
    for backend in ("local", "ray"):
        setting = ppqlike.QuantizationSettingFactory.for_platform(platform, recipe=recipe)
        for name, value in changes.items():
            setattr(setting, name, value)
        setting.calibration_backend, setting.calibration_workers = backend, 2
        graph = ppqlike.quantize_onnx_model(model, batches, platform=platform, setting=setting)
        results[backend] = (graph, _configs(graph), ppqlike.NumpyExecutor(graph).forward(batches[0]))
    return results


def _assert_same_results(results: dict, *passes: str):
    (local, local_configs, local_outputs), (ray, ray_configs, ray_outputs) = results["local"], results["ray"]
    for key in ("configs", "parameters"):   # (compared whole: a failure does not print megabytes of diff)
        assert (ray_configs[key] == local_configs[key]) is True, key
    for got, want in zip(ray_outputs, local_outputs):
        np.testing.assert_array_equal(got, want)
    for name in passes:
        mine, theirs = dict(_report(ray, name)), dict(_report(local, name))
        for key in ("seconds", "backend", "workers", "worker_seconds", "worker_peak_mib", "worker_tasks",
                    "shards_read_by_workers"):
            mine.pop(key, None), theirs.pop(key, None)
        assert mine == theirs, name


def test_accuracy_target_trials_on_workers_give_the_local_moves(ray_cluster):
    """The chain model on DSP_INT8 with an unreachable target: the sensitivity of every unit, the greedy's
    INT16 then FP32 trial moves (measured two at a time, the second speculatively) as on the local run."""
    from test_accuracy_passes import chain_model, data
    results = _quantized_twice(chain_model(), data(2), "DSP_INT8", recipe="plain", accuracy_target=1.0,
                               mixed_precision_batches=1)
    _assert_same_results(results, "mixed_precision")
    report = _report(results["ray"][0], "mixed_precision")
    assert report["backend"] == "ray" and report["worker_tasks"] >= 2
    assert {step.get("precision") for step in report["trace"]} >= {"INT16", "FP32"}


@requires_bench
@pytest.mark.real_model
def test_accuracy_target_with_pruning_on_workers_gives_the_local_graph(ray_cluster):
    """SqueezeNet, ORT_INT8 plain, target 0.999 on 2 held-aside images: units moved to INT16, then moves
    undone where the target holds without them (measured two at a time): the local run's configs, trace and
    outputs."""
    from shared_bench import load_images
    images, _, _ = load_images("squeezenet1.1", "calib", 8)
    batches = [images[i:i + 2] for i in range(0, 8, 2)]
    results = _quantized_twice(str(PRESETS["squeezenet1.1"].path), batches, "ORT_INT8", recipe="plain",
                               accuracy_target=0.999, mixed_precision_batches=1)
    _assert_same_results(results, "mixed_precision")
    report = _report(results["ray"][0], "mixed_precision")
    assert report["reached"] and any("restored" in step for step in report["trace"]), report["trace"]


@requires_bench
@pytest.mark.real_model
def test_threshold_search_on_workers_selects_the_local_thresholds(ray_cluster):
    """SqueezeNet on TPU_INT8 with the search observer: the tensors' candidates tried on two workers give the
    thresholds (and errors) of the local run."""
    from shared_bench import load_images
    images, _, _ = load_images("squeezenet1.1", "calib", 8)
    batches = [images[i:i + 2] for i in range(0, 8, 2)]
    results = _quantized_twice(str(PRESETS["squeezenet1.1"].path), batches, "TPU_INT8",
                               activation_observer="search")
    _assert_same_results(results, "calibration")
    assert _report(results["ray"][0], "calibration")["searched"] > 20
    details = [c.detail["search"] for op in results["ray"][0].operations.values() if op.config is not None
               for c in op.config.all_configs() if "search" in c.detail]
    assert len(details) > 20 and any(d["selected"] < len(d["candidates"]) - 1 for d in details)


def _dies_once_observing(graph, shards):
    """calibration.observe_shards, but the first task to run (on a worker) observes one batch and then kills
    its worker process, leaving the marker file behind so that Ray's retry runs through."""
    from ppqlike.optim.passes.calibration import observe_shard, observe_shards
    marker = os.environ.get(DIE_MARKER)
    if marker and not os.path.exists(marker):
        open(marker, "w").close()
        observe_shard(graph, list(shards[0])[:1])   # in the middle of the work
        os._exit(1)
    return observe_shards(graph, shards)


def test_a_worker_killed_mid_task_is_retried_and_gives_the_local_scales(ray_cluster, monkeypatch):
    """A Ray worker process that dies in the middle of its calibration shard is replaced and the task run
    again (max_retries): the scales are the local run's bit for bit."""
    from ppqlike.optim.passes import calibration
    from test_accuracy_passes import chain_model, data
    monkeypatch.setattr(calibration, "observe_shards", _dies_once_observing)
    assert not os.path.exists(ray_cluster.marker)
    # (8 batches of 4: 2 held aside, 6 run as a batch of 8 and one of 16, one per worker)
    results = _quantized_twice(chain_model(), data(8), "TPU_INT8", activation_observer="kl")
    assert os.path.exists(ray_cluster.marker)   # a worker died
    _assert_same_results(results, "calibration")
    assert _report(results["ray"][0], "calibration")["workers"] == 2


# ------------------------------------------------------------------ learned rounding on the workers
def _rounding_report(graph) -> dict:
    """The adaround pass's report without its timings and where it ran."""
    report = dict(_report(graph, "adaround"))
    for key in ("capture_seconds", "backend", "workers", "worker_seconds", "worker_peak_mib"):
        report.pop(key, None)
    report["layer_details"] = [{k: v for k, v in layer.items() if k != "seconds"}
                               for layer in report["layer_details"]]
    return report


def _assert_same_rounding(results: dict, layers: int):
    """Configs JSON, outputs, the baked weights and the rounding report of 'ray' as of 'local'; ``layers``
    layers rounded, split over both workers."""
    _assert_same_results(results)
    (local, _, _), (ray, _, _) = results["local"], results["ray"]
    baked = 0
    for name, operation in local.operations.items():
        if operation.type in ("Conv", "Gemm") and "adaround" in operation.config.input_quantization_config[1].detail:
            mine = ray.operations[name].config.input_quantization_config[1]
            theirs = operation.config.input_quantization_config[1]
            assert mine.baked_value.dtype == theirs.baked_value.dtype == np.float32
            np.testing.assert_array_equal(mine.baked_value, theirs.baked_value)
            np.testing.assert_array_equal(mine.scale, theirs.scale)
            baked += 1
    assert baked == layers
    assert _rounding_report(ray) == _rounding_report(local)
    report = _report(ray, "adaround")
    assert report["backend"] == "ray" and report["layers"] == layers and report["workers"] == 2
    assert _report(local, "adaround")["backend"] == "local"


def test_learned_rounding_on_workers_gives_the_local_weights(ray_cluster):
    """The chain model at W4A8: its 5 layers' rounding (scale search and Adam iterations) on two workers gives
    the local run's configs, baked weights and outputs bit for bit."""
    from test_accuracy_passes import chain_model, data
    results = _quantized_twice(chain_model(), data(3), "ACADEMIC_W4A8", adaround=True, adaround_steps=100,
                               adaround_samples=256, protection=False,
                               float_outputs=False)
    _assert_same_rounding(results, 5)
    assert _report(results["ray"][0], "adaround")["improved"] >= 1   # the learned rounding was kept somewhere


def test_learned_rounding_on_workers_stops_at_a_spent_budget_like_the_local_run(ray_cluster):
    """A time budget spent before the layers: on the workers as here, every layer keeps nearest rounding."""
    from test_accuracy_passes import chain_model, data
    results = _quantized_twice(chain_model(), data(3), "ACADEMIC_W4A8", adaround=True, adaround_steps=100,
                               adaround_samples=256, protection=False, time_budget_s=0.0,
                               float_outputs=False)
    _assert_same_results(results)
    for backend in ("local", "ray"):
        report = _report(results[backend][0], "adaround")
        assert report["layers"] == 0 and report["budget_spent"] and report["skipped"] == 5, report


@requires_bench
@pytest.mark.real_model
def test_learned_rounding_of_squeezenet_on_workers_gives_the_local_weights(ray_cluster):
    """SqueezeNet 1.1 at W4A8 on 4 images (a few Adam steps per layer): the 26 convolutions rounded on two
    workers give the local run's configs, baked weights and outputs."""
    from shared_bench import load_images
    images, _, _ = load_images("squeezenet1.1", "calib", 4)
    batches = [images[i:i + 2] for i in range(0, 4, 2)]
    results = _quantized_twice(str(PRESETS["squeezenet1.1"].path), batches, "ACADEMIC_W4A8", adaround=True,
                               adaround_steps=40, adaround_samples=512, protection=False)
    _assert_same_rounding(results, 26)
