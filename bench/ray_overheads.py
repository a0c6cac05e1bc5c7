"""The fixed costs of sending work to Ray workers, and the unit costs of the work, for docs/SCALE.md.

    python bench/ray_overheads.py                                  # SqueezeNet and MobileNetV2, 2 workers
    python bench/ray_overheads.py --models mobilenetv2 --workers 2 --images 16

Measured, per model (quantized with ORT_INT8 'plain' on ``--images`` calibration images, batches of 2):
the quantized graph's pickle size and the seconds to pickle it here and to unpickle it in a worker (what
every map over workers pays once per task), one calibration batch's forward with the observers, one unit's
sensitivity measurement (a partial forward) and one trial move's measurement (a whole forward per batch) as
the accuracy target runs them here.  Once: Ray's start (``ray.init`` of a local cluster) and shutdown, the
first task (a worker process starting and importing ppqlike) and a warm no-op task's round trip.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))


def _unpickle_seconds(payload: bytes) -> float:
    started = time.perf_counter()
    pickle.loads(payload)
    return time.perf_counter() - started


def _import_ppqlike() -> float:
    started = time.perf_counter()
    import ppqlike.optim.passes.calibration  # noqa: F401
    return time.perf_counter() - started


def _noop() -> int:
    return 0


def model_costs(name: str, images: int, ray) -> dict:
    import numpy as np
    import presets
    import ppqlike
    from ppqlike.optim.passes.calibration import observe_shard
    from ppqlike.optim.passes.precision_trials import TrialData, trial_cosines, unit_sensitivities
    from ppqlike.optim.passes.precision_moves import find_units
    from ppqlike.executor.simulation import dequantized
    data, _, _ = presets.load_images(name, "calib", images)
    batches = [data[i:i + 2] for i in range(0, len(data), 2)]
    setting = ppqlike.QuantizationSettingFactory.for_platform("ORT_INT8", recipe="plain")
    graph = ppqlike.quantize_onnx_model(str(presets.PRESETS[name].path), batches, platform="ORT_INT8",
                                        setting=setting)
    started = time.perf_counter()
    payload = pickle.dumps(graph)
    pickle_s = time.perf_counter() - started
    unpickle_s = ray.get(ray.remote(num_cpus=1)(_unpickle_seconds).remote(payload))
    started = time.perf_counter()
    observe_shard(graph, batches[:1])
    observe_s = time.perf_counter() - started
    executor = ppqlike.NumpyExecutor(graph)
    with dequantized(graph):
        references = [executor.forward(b) for b in batches[:1]]
    units = find_units(graph)
    shared = TrialData(graph, batches[:1], references, [[op.name for op in u] for u in units])
    started = time.perf_counter()
    unit_sensitivities(shared, list(range(len(units))))
    sensitivity_s = (time.perf_counter() - started) / len(units)
    started = time.perf_counter()
    trial_cosines(shared, [[]] * 3)
    trial_s = (time.perf_counter() - started) / 3
    return {"model": name, "operations": len(graph.operations), "units": len(units),
            "graph_pickle_mib": round(len(payload) / 2 ** 20, 1), "pickle_s": round(pickle_s, 3),
            "worker_unpickle_s": round(unpickle_s, 3), "calibration_batch_s": round(observe_s, 3),
            "sensitivity_per_unit_s": round(sensitivity_s, 4), "trial_per_batch_s": round(trial_s, 3),
            "batch": 2, "input": list(np.shape(batches[0]))}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["squeezenet1.1", "mobilenetv2"])
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    import warnings
    warnings.simplefilter("ignore")
    import ray
    from ppqlike.optim.distributed import _ppqlike_path
    path = os.pathsep.join(p for p in (_ppqlike_path(), str(BENCH), os.environ.get("PYTHONPATH")) if p)
    started = time.perf_counter()
    ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    start_s = time.perf_counter() - started
    started = time.perf_counter()
    import_s = ray.get(ray.remote(num_cpus=1)(_import_ppqlike).remote())
    first_s = time.perf_counter() - started
    noop = ray.remote(num_cpus=1)(_noop)
    ray.get(noop.remote())
    started = time.perf_counter()
    for _ in range(20):
        ray.get(noop.remote())
    warm_s = (time.perf_counter() - started) / 20
    fixed = {"ray_init_s": round(start_s, 2), "first_task_s": round(first_s, 2),
             "worker_import_ppqlike_s": round(import_s, 2), "warm_task_round_trip_s": round(warm_s, 4)}
    print(json.dumps(fixed))
    for name in args.models:
        print(json.dumps(model_costs(name, args.images, ray)))
    started = time.perf_counter()
    ray.shutdown()
    print(json.dumps({"ray_shutdown_s": round(time.perf_counter() - started, 2)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
