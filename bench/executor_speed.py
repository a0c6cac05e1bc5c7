"""Throughput of ppqlike's NumpyExecutor against onnxruntime on the shared models.

    python bench/executor_speed.py                    # whole models, batch 16, what a user gets
    python bench/executor_speed.py --per-layer        # every Conv alone: where the time goes
    python bench/executor_speed.py --models mobilenetv2 --iterations 5 --threads 2
    python bench/executor_speed.py --simulation       # quantization simulation of every platform vs FP32
    python bench/executor_speed.py --baseline ../old  # also an older checkout's executor, interleaved (A/B)

Both sides get the same number of threads, T (``--threads``, default: the
cores this process may use, which is what each side takes by itself):
onnxruntime through ``intra_op_num_threads`` (and ``inter_op_num_threads``);
numpy in one of three ways (``--numpy-threading``):

* ``default``: nothing set, what a user gets after ``import ppqlike``: the
  library runs OpenBLAS single-threaded while it computes (threadpoolctl) and
  spreads its kernels' independent work on as many Python threads as the
  process has cores (see ``ppqlike/executor/ops/_threads.py``).  With
  ``--threads`` other than the core count, the kernel threads are set with
  ``ppqlike.executor.set_num_threads`` (a user's call).
* ``pool``: the same through the environment (``OPENBLAS_NUM_THREADS=1``,
  ``PPQLIKE_NUM_THREADS=T``), as earlier rounds measured.
* ``openblas``: OpenBLAS with T threads inside each GEMM
  (``OPENBLAS_NUM_THREADS=T``), the kernels single-threaded.  OpenBLAS's
  spin-waiting threads collapse when the cores are oversubscribed (seen: 34
  1x1 convs taking 2 s instead of 60 ms while other jobs ran).

The variables are read when numpy loads, so this script sets them (for the
two tuned modes only) before importing numpy.  ``--openblas-coretype``
sets ``OPENBLAS_CORETYPE`` (default: leave OpenBLAS's own choice, as a user
has it).

Timings on a shared machine are noisy: the two sides are timed interleaved,
run by run, and the best run of each is reported, with the ratio
ours/onnxruntime in throughput (higher is better; 1.0 = as fast).  The
interleaved onnxruntime session does not spin its idle threads (spinning
threads steal the cores from the executor timed next: a depthwise conv right
after an onnxruntime run measured 290 ms instead of 5 ms); onnxruntime with its
default spinning is then timed alone, and the better of the two is reported.

The models live in ``<repo>/../shared/bench/models`` (``--bench-dir`` to
override); the script exits with a clear message when they are absent.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODELS = {  # name: (file, input name, image preprocessing options of ppqlike.io.images)
    "mobilenetv2": ("mobilenetv2.onnx", "input",
                    dict(scale=255, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))),
    "efficientnet_lite0": ("efficientnet_lite0.onnx", "input", dict(mean=127.0, std=128.0)),
    "squeezenet1.1": ("squeezenet1.1.onnx", "data_0", dict(mean=(103.94, 116.78, 123.68), bgr=True)),
    "vit_s_focus": ("vit_s_focus.onnx", "input_image",
                    dict(scale=255, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))),
}


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench-dir", default=str(REPO.parent / "shared" / "bench"),
                        help="folder holding models/ and images/ (default: ../shared/bench from the repo root)")
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=list(MODELS))
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--threads", type=int, default=None,
                        help="threads of each side (default: the cores this process may use)")
    parser.add_argument("--numpy-threading", choices=("default", "pool", "openblas"), default="default",
                        help="default: nothing set, ppqlike's own choice (what a user gets); pool: "
                             "OPENBLAS_NUM_THREADS=1 PPQLIKE_NUM_THREADS=--threads; openblas: OpenBLAS "
                             "--threads threads, ppqlike's kernels 1")
    parser.add_argument("--iterations", type=int, default=5, help="timed runs of each side (default 5)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--per-layer", action="store_true",
                        help="time every Conv of the models alone, ours against onnxruntime's (inputs C-ordered "
                             "NCHW; inside a model the layers after a depthwise one read channels-last inputs)")
    parser.add_argument("--random", action="store_true", help="random inputs instead of real images")
    parser.add_argument("--openblas-coretype", default="none",
                        help="OPENBLAS_CORETYPE to set ('auto': SkylakeX on AVX-512 CPUs; default 'none': leave "
                             "OpenBLAS's own choice)")
    parser.add_argument("--verbose", action="store_true", help="per-layer mode: print every layer")
    parser.add_argument("--baseline", metavar="DIR",
                        help="whole-model mode: also time the executor of the ppqlike source tree in DIR (say a "
                             "git worktree of an older commit), interleaved with the others in this process")
    parser.add_argument("--simulation", nargs="*", metavar="PLATFORM",
                        help="time the quantization simulation of these platforms (none named: all nine) "
                             "against the FP32 executor, each quantized with the plain recipe on "
                             "--calibration-images calibration images")
    parser.add_argument("--calibration-images", type=int, default=16)
    return parser.parse_args()


def _cpu_has_avx512() -> bool:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= flags
    except OSError:
        pass
    return False


def _configure_threads(args) -> str:
    """Set the thread and OpenBLAS variables; must run before numpy is imported."""
    if "numpy" in sys.modules:
        raise RuntimeError("numpy was imported before the thread settings were made")
    if args.threads is None:
        args.threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if args.numpy_threading != "default":
        blas, pool = (1, args.threads) if args.numpy_threading == "pool" else (args.threads, 1)
        for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[name] = str(blas)
        os.environ["PPQLIKE_NUM_THREADS"] = str(pool)
    coretype = args.openblas_coretype
    if coretype == "auto":
        coretype = os.environ.get("OPENBLAS_CORETYPE") or ("SkylakeX" if _cpu_has_avx512() else "none")
    if coretype.lower() != "none":
        os.environ["OPENBLAS_CORETYPE"] = coretype
    return os.environ.get("OPENBLAS_CORETYPE", "OpenBLAS's choice")


def main() -> int:
    args = _parse()
    bench_dir = Path(args.bench_dir)
    missing = [MODELS[m][0] for m in args.models if not (bench_dir / "models" / MODELS[m][0]).is_file()]
    if missing:
        print(f"error: the shared benchmark models are not in {bench_dir / 'models'} (missing: "
              f"{', '.join(missing)}); pass --bench-dir pointing at the folder that holds models/ "
              "(see ../shared/bench/README.md)", file=sys.stderr)
        return 2
    coretype = _configure_threads(args)
    sys.path.insert(0, str(REPO))
    import numpy as np
    import onnxruntime

    from ppqlike.executor import computing_threads, num_threads, set_num_threads
    if args.numpy_threading == "default" and args.threads != num_threads():
        set_num_threads(args.threads)
    blas = _blas_description(np)
    with computing_threads():
        blas_while_computing = _blas_threads()
    print(f"threads: onnxruntime intra=inter={args.threads}; numpy: OpenBLAS {blas_while_computing} while ppqlike "
          f"computes ({blas}, OPENBLAS_CORETYPE={coretype}), ppqlike kernels {num_threads()} "
          f"(--numpy-threading {args.numpy_threading})")
    print(f"onnxruntime {onnxruntime.__version__}, numpy {np.__version__}, batch {args.batch}, "
          f"{args.iterations} timed runs each, best run reported\n")
    for name in args.models:
        if args.simulation is not None:
            _simulation(name, bench_dir, args)
        elif args.per_layer:
            _per_layer(name, bench_dir, args)
        else:
            _whole_model(name, bench_dir, args)
    return 0


def _blas_threads() -> str:
    from threadpoolctl import threadpool_info
    return ",".join(str(entry["num_threads"]) for entry in threadpool_info() if entry.get("user_api") == "blas")


def _blas_description(np) -> str:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "threadpoolctl absent: kernel unknown"
    for entry in threadpool_info():
        if entry.get("user_api") == "blas":
            return f"{entry.get('internal_api')} {entry.get('version')} {entry.get('architecture')} kernels"
    return "no BLAS found"


# ----------------------------------------------------------------- helpers --
def _ort_session(model_bytes: bytes, threads: int, spinning: bool = False):
    """An onnxruntime CPU session.  Without ``spinning`` its idle worker threads sleep at once instead of
    busy-waiting for the next run, which would otherwise steal the cores from whatever runs next
    (measured: a depthwise conv right after an onnxruntime run took 290 ms instead of 5 ms)."""
    import onnxruntime
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = threads
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return onnxruntime.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])


def _interleaved(functions: dict, iterations: int, warmup: int) -> dict:
    """Best wall time of each function, timed in turns."""
    import time
    for function in functions.values():
        for _ in range(warmup):
            function()
    best = {name: float("inf") for name in functions}
    for _ in range(iterations):
        for name, function in functions.items():
            start = time.perf_counter()
            function()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def _inputs(name: str, bench_dir: Path, args, np):
    file, input_name, options = MODELS[name]
    if not args.random:
        try:
            from ppqlike.io.images import load_image_folder
            images, _ = load_image_folder(bench_dir / "images" / "dev", limit=args.batch, **options)
            if len(images) == args.batch:
                return input_name, np.ascontiguousarray(images, dtype=np.float32), "real dev images"
        except Exception as error:  # Pillow absent, folder absent: fall back to noise
            print(f"  (real images unavailable: {error}; using random input)")
    rng = np.random.default_rng(0)
    return input_name, rng.standard_normal((args.batch, 3, 224, 224)).astype(np.float32), "random input"


# ------------------------------------------------------------- whole model --
def _whole_model(name: str, bench_dir: Path, args) -> None:
    import numpy as np
    import ppqlike

    path = bench_dir / "models" / MODELS[name][0]
    input_name, batch, source = _inputs(name, bench_dir, args, np)
    session = _ort_session(path.read_bytes(), args.threads)
    try:
        executor = ppqlike.NumpyExecutor(ppqlike.load_onnx_graph(str(path)))
    except ppqlike.PPQLikeError as error:
        print(f"{name}: the executor cannot run it yet: {error}\n")
        return
    ours = executor.forward({input_name: batch})[0]
    theirs = session.run(None, {input_name: batch})[0]
    functions = {"ppqlike": lambda: executor.forward({input_name: batch}),
                 "onnxruntime": lambda: session.run(None, {input_name: batch})}
    if args.baseline:
        baseline = _baseline_executor(args.baseline, str(path))
        functions["baseline"] = lambda: baseline.forward({input_name: batch})
    best = _interleaved(functions, args.iterations, args.warmup)
    # onnxruntime's default (spinning worker threads) timed alone, last: it may be faster; keep its best
    spinning = _ort_session(path.read_bytes(), args.threads, spinning=True)
    best["onnxruntime"] = min(best["onnxruntime"], _interleaved(
        {"ort": lambda: spinning.run(None, {input_name: batch})}, args.iterations, args.warmup)["ort"])
    del spinning
    rate = {k: args.batch / v for k, v in best.items()}
    difference = np.abs(ours.astype(np.float64) - theirs) / max(float(np.abs(theirs).max()), 1e-30)
    agree = float(np.mean(ours.argmax(-1) == theirs.argmax(-1))) if ours.ndim == 2 else float("nan")
    print(f"{name} ({source}, batch {args.batch}):")
    print(f"  ppqlike     {rate['ppqlike']:8.1f} images/s  ({best['ppqlike'] * 1e3:7.1f} ms/batch)")
    print(f"  onnxruntime {rate['onnxruntime']:8.1f} images/s  ({best['onnxruntime'] * 1e3:7.1f} ms/batch)")
    if "baseline" in rate:
        print(f"  baseline    {rate['baseline']:8.1f} images/s  ({best['baseline'] * 1e3:7.1f} ms/batch; "
              f"ratio baseline/onnxruntime {rate['baseline'] / rate['onnxruntime']:.2f})")
    print(f"  ratio ppqlike/onnxruntime {rate['ppqlike'] / rate['onnxruntime']:.2f}; "
          f"max |difference| / max |output| = {difference.max():.2e}; top-1 agreement {agree:.3f}\n")


def _baseline_executor(root: str, path: str):
    """A NumpyExecutor of ``path`` built by the ppqlike package of the source tree ``root``, loaded beside
    this one: the baseline's modules are imported under the same names while this tree's are set aside,
    then put back (the baseline's objects keep their own module globals)."""
    def ours():
        return {name: module for name, module in sys.modules.items()
                if name == "ppqlike" or name.startswith("ppqlike.")}
    saved = ours()
    for name in saved:
        del sys.modules[name]
    sys.path.insert(0, str(Path(root).resolve()))
    try:
        import ppqlike as baseline
        return baseline.NumpyExecutor(baseline.load_onnx_graph(path))
    finally:
        sys.path.pop(0)
        for name in ours():
            del sys.modules[name]
        sys.modules.update(saved)


# -------------------------------------------------------------- simulation --
def _simulation(name: str, bench_dir: Path, args) -> None:
    """Forward time of each platform's quantized graph against the FP32 graph, same executor, same batch."""
    import warnings

    import numpy as np
    import ppqlike
    from ppqlike.io.images import load_image_folder
    from ppqlike.platforms.policies import PLATFORM_POLICIES

    platforms = args.simulation or [platform.name for platform in PLATFORM_POLICIES]
    file, input_name, options = MODELS[name]
    path = str(bench_dir / "models" / file)
    input_name, batch, source = _inputs(name, bench_dir, args, np)
    calibration, _ = load_image_folder(bench_dir / "images" / "calib", limit=args.calibration_images, **options)
    calibration = [np.ascontiguousarray(calibration, dtype=np.float32)]
    fp32 = ppqlike.NumpyExecutor(ppqlike.load_onnx_graph(path))
    print(f"{name} ({source}, batch {args.batch}; each platform quantized with the plain recipe on "
          f"{len(calibration[0])} calibration images):")
    for platform in platforms:
        setting = ppqlike.QuantizationSettingFactory.for_platform(platform, recipe="plain")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            graph = ppqlike.quantize_onnx_model(path, calibration, platform=platform, setting=setting)
        simulated = ppqlike.NumpyExecutor(graph)
        best = _interleaved({"fp32": lambda: fp32.forward({input_name: batch}),
                             "simulation": lambda: simulated.forward({input_name: batch})},
                            args.iterations, args.warmup)
        print(f"  {platform:14s} FP32 {best['fp32'] * 1e3:8.1f} ms  simulation {best['simulation'] * 1e3:8.1f} ms"
              f"  ratio {best['simulation'] / best['fp32']:5.2f}", flush=True)
    print()


# --------------------------------------------------------------- per layer --
def _conv_layers(path: Path, image):
    """Every Conv of the model: (name, its input for ``image`` [1, ...], weight, bias, attributes).

    The model runs once in onnxruntime on one image with every Conv input
    exposed, so that each layer is later timed on a real activation (zero
    borders from explicit Pad ops included), repeated to the batch size.
    """
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(path))
    graph = model.graph
    initializers = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    convs = [n for n in graph.node if n.op_type == "Conv"]
    wanted = sorted({name for n in convs for name in n.input if name and name not in initializers})
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    known = {o.name for o in probe.graph.output}
    for name in wanted:
        if name not in known:
            probe.graph.output.append(helper.make_empty_tensor_value_info(name))
    session = _ort_session(probe.SerializeToString(), 1)
    feed = {session.get_inputs()[0].name: image}
    values = dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))
    values.update(initializers)
    layers = []
    for index, node in enumerate(convs):
        weight = np.asarray(values[node.input[1]], np.float32)
        bias = np.asarray(values[node.input[2]], np.float32) if len(node.input) > 2 and node.input[2] else None
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        layers.append((node.name or f"conv_{index}", np.asarray(values[node.input[0]], np.float32),
                       weight, bias, attributes))
    return layers


def _layer_kind(x_shape, weight, attributes) -> str:
    group = int(attributes.get("group", 1))
    if group == 1:
        return "pointwise" if weight.shape[2:] == (1, 1) else "dense"
    return "depthwise" if group == x_shape[1] and weight.shape[1] == 1 else "grouped"


def _per_layer(name: str, bench_dir: Path, args) -> None:
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper
    import ppqlike

    path = bench_dir / "models" / MODELS[name][0]
    _, images, source = _inputs(name, bench_dir, args, np)
    layers = _conv_layers(path, images[:1])
    totals: dict = {}
    print(f"{name}: {len(layers)} Conv layers at batch {args.batch} (activations of one image, {source}, "
          f"repeated)")
    for layer_name, x_one, weight, bias, attributes in layers:
        x_shape = (args.batch,) + x_one.shape[1:]
        inits = [numpy_helper.from_array(weight, "W")]
        inputs = ["X", "W"]
        if bias is not None:
            inits.append(numpy_helper.from_array(bias, "B"))
            inputs.append("B")
        node = helper.make_node("Conv", inputs, ["Y"], **attributes)
        graph = helper.make_graph([node], "layer", [helper.make_tensor_value_info("X", 1, list(x_shape))],
                                  [helper.make_tensor_value_info("Y", 1, None)], inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        model.ir_version = 10
        model = onnx.shape_inference.infer_shapes(model)
        session = _ort_session(model.SerializeToString(), args.threads)
        executor = ppqlike.NumpyExecutor(ppqlike.load_onnx_graph(model))
        x = np.ascontiguousarray(np.repeat(x_one, args.batch, axis=0))
        ours, theirs = executor.forward({"X": x})[0], session.run(None, {"X": x})[0]
        error = float(np.abs(ours - theirs).max() / max(float(np.abs(theirs).max()), 1e-30))
        best = _interleaved({"ours": lambda: executor.forward({"X": x}),
                             "ort": lambda: session.run(None, {"X": x})}, args.iterations, args.warmup)
        spinning = _ort_session(model.SerializeToString(), args.threads, spinning=True)
        best["ort"] = min(best["ort"], _interleaved({"ort": lambda: spinning.run(None, {"X": x})},
                                                    args.iterations, args.warmup)["ort"])
        del spinning
        kind = _layer_kind(x_shape, weight, attributes)
        entry = totals.setdefault(kind, [0.0, 0.0, 0])
        entry[0] += best["ours"]
        entry[1] += best["ort"]
        entry[2] += 1
        if args.verbose:
            print(f"  {kind:9s} x{list(x_shape)} w{list(weight.shape)} s{attributes.get('strides', [1, 1])}: "
                  f"ours {best['ours'] * 1e3:7.2f} ms  ort {best['ort'] * 1e3:7.2f} ms  "
                  f"ours/ort time {best['ours'] / best['ort']:5.2f}  rel.err {error:.1e}")
    ours_total = sum(v[0] for v in totals.values())
    ort_total = sum(v[1] for v in totals.values())
    for kind, (ours_time, ort_time, count) in sorted(totals.items()):
        print(f"  {kind:9s} {count:3d} layers: ours {ours_time * 1e3:8.1f} ms  ort {ort_time * 1e3:8.1f} ms  "
              f"time ratio ours/ort {ours_time / ort_time:5.2f}")
    print(f"  all convs     : ours {ours_total * 1e3:8.1f} ms  ort {ort_total * 1e3:8.1f} ms  "
          f"time ratio ours/ort {ours_total / ort_total:5.2f} (throughput ratio {ort_total / ours_total:.2f})\n")


if __name__ == "__main__":
    sys.exit(main())
