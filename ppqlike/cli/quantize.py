"""``ppqlike quantize``: an ONNX model and a calibration folder in, a quantized model folder out."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings

from ..core.errors import CalibrationDataError, ModelLoadError, PlatformError, PPQLikeError
from ..platforms.target import QUANTIZED_PLATFORMS, TargetPlatform
from .argument_types import channel_numbers, image_size, positive_integer, tensor_shape

SUMMARY_NAME = "summary.json"
REPORT_NAME = "report.html"

DESCRIPTION = """\
Quantize MODEL.onnx for a target platform, calibrating on a folder of images or
of .npy/.npz arrays, and write into --out:

  <stem>.<platform>.onnx   the quantized model (QDQ ONNX), e.g. mobilenetv2.trt_int8.onnx
  <stem>.<platform>.json   every tensor's quantization parameters (scales, offsets, bits, states)
  summary.json             ops on TARGET / FP32 / SOI, times, peak memory, the files written
  report.html              one offline page: settings, dispatch, per-op error chart (graph-wise SNR on
                           the first calibration batch), FP32 / float IR / simulation / exported
                           comparison, what each pass did
  (platform extras)        whatever the platform's exporter writes beside the model

Files are written whole or not at all (temporary name, then rename); if
quantization fails nothing is written.  The input model is only read.

Calibration folder: images (.jpg .jpeg .png .bmp .webp .tif .tiff) for
single-input image models, or .npy files (single input) / .npz files (arrays
keyed by input name); an array with the input's rank is a batch, one rank
lower a single sample.  Other files are skipped with a warning.

Image preprocessing, per pixel value x in 0..255 and per channel:
    x' = (x / scale - mean) / std
after resizing the shorter side to --resize (bilinear), centre-cropping to
--crop, and RGB -> BGR with --bgr (mean/std are then in BGR order).
--crop defaults to the model's height and width; --resize to the crop's
larger side.  --letterbox replaces resize and crop: the image is scaled to fit
inside the model's height x width (or --letterbox N / HxW), keeping its aspect
ratio, and centred on a canvas of --letterbox-value (default 114), as YOLO
models expect.  A model whose height and width are not fixed takes the size
from --crop, --letterbox N or --input-shape; without one, the images must all
have one size.
ImageNet-style:  --resize 256 --crop 224 --scale 255 --mean 0.485,0.456,0.406 --std 0.229,0.224,0.225
YOLO-style:      --letterbox --scale 255        (--letterbox 640 for a dynamic-size model)
Caffe-style raw pixel means: --bgr --mean 103.94,116.78,123.68
(ppqlike.io.images.load_image's scale= is the same divisor as --scale.)

Before any calibration data is read, the model is checked: an op the
executor cannot run is named (one line), and a dynamic input without a size
from the options is an error naming the input and the option.
"""


def add_quantize_parser(commands) -> argparse.ArgumentParser:
    parser = commands.add_parser("quantize", help="quantize an ONNX model on a calibration folder",
                                 description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", metavar="MODEL.onnx", help="the FP32 ONNX model (only read)")
    parser.add_argument("--platform", default="trt_int8",
                        help=f"target platform, any case (default trt_int8): "
                             f"{', '.join(p.name.lower() for p in QUANTIZED_PLATFORMS)}")
    parser.add_argument("--calib", required=True, metavar="DIR", help="calibration folder (images or .npy/.npz)")
    parser.add_argument("--out", required=True, metavar="DIR", help="output folder (created if absent)")
    parser.add_argument("--model-name", metavar="NAME",
                        help="file name of the quantized model in --out (default <stem>.<platform>.onnx)")
    group = parser.add_argument_group("calibration")
    group.add_argument("--batch-size", type=positive_integer, default=None, metavar="N",
                       help="samples per batch (default: the model's fixed batch size, else 16)")
    group.add_argument("--calib-steps", type=positive_integer, metavar="N",
                       help="use the first N batches (default all)")
    group.add_argument("--input-shape", type=tensor_shape, metavar="SHAPE",
                       help="input shape of a single-input model, e.g. 1,3,224,224 or N,3,224,224; the batch "
                            "dimension is --batch-size; checked against the data and used for image layout/crop")
    group = parser.add_argument_group("image preprocessing (x' = (x / scale - mean) / std)")
    group.add_argument("--resize", type=positive_integer, metavar="N",
                       help="resize the shorter side to N pixels (default: the crop's larger side)")
    group.add_argument("--crop", type=image_size, metavar="N|HxW",
                       help="centre crop (default: the model's H and W; a model whose H and W are not fixed "
                            "needs --crop, --letterbox N or --input-shape unless all images have one size)")
    group.add_argument("--letterbox", type=image_size, nargs="?", const=True, metavar="N|HxW",
                       help="instead of --resize/--crop: scale each image to fit inside the model's H and W (or "
                            "N / HxW), keeping its aspect ratio, and pad it centred (YOLO's preprocessing)")
    group.add_argument("--letterbox-value", type=channel_numbers, default=[114.0], metavar="V[,V,V]",
                       help="pad value of --letterbox in 0..255 pixel units, one or per channel (default 114)")
    group.add_argument("--mean", type=channel_numbers, default=[0.0], metavar="M[,M,M]", help="per channel (default 0)")
    group.add_argument("--std", type=channel_numbers, default=[1.0], metavar="S[,S,S]", help="per channel (default 1)")
    group.add_argument("--scale", type=float, default=1.0,
                       help="pixels are divided by this first (default 1: raw 0..255 values)")
    group.add_argument("--bgr", action="store_true", help="feed channels in BGR order")
    group.add_argument("--layout", choices=("NCHW", "NHWC"), type=str.upper,
                       help="image batch layout (default: what the model's input shape says, else NCHW)")
    group = parser.add_argument_group("quantization")
    group.add_argument("--setting", metavar="FILE.json", help="a QuantizationSetting saved as JSON "
                                                               "(default: the platform's preset)")
    group.add_argument("--dispatch-table", metavar="FILE",
                       help="pin ops: a JSON object {op_name: TARGET|FP32} or lines 'op_name TARGET|FP32' "
                            "(# starts a comment)")
    group.add_argument("--dispatcher", help="conservative | aggressive | pointwise | allin")
    group.add_argument("--observer", help="activation observer: minmax | percentile | kl | entropy | mse | search")
    group.add_argument("--recipe", choices=("plain", "balanced", "best"),
                       help="plain: the platform's own calibration; balanced: activation ranges chosen by the "
                            "error they cause (default: the setting's, balanced); best: balanced plus learned "
                            "rounding of the weights and bias correction (minutes)")
    group.add_argument("--accuracy-target", type=float, metavar="COSINE",
                       help="move the fewest ops to the platform's 16-bit grid (onnxruntime, DSP, TIDL), else FP32, "
                            "until the output cosine against FP32 (on the last 2 calibration batches, held aside from "
                            "calibration) reaches COSINE; "
                            "the summary lists them")
    group.add_argument("--time-budget", type=float, metavar="SECONDS",
                       help="wall seconds of the whole quantization that the best recipe's optional work (learned "
                            "rounding, range search, bias correction) may fill (default: the recipe's own, 240)")
    group.add_argument("--recalibrate", action="store_true",
                       help="for an already quantized model (QDQ/QOperator): drop its scales and calibrate its float "
                            "graph again for --platform (see `ppqlike inspect` for what it holds)")
    group = parser.add_argument_group("weight-only quantization (W4A16 / W8A16: MatMul/Gemm weights in blocks, "
                                      "activations float)")
    group.add_argument("--weight-only", type=int, choices=(4, 8), metavar="BITS",
                       help="quantize only the MatMul/Gemm weights, to 4 or 8 bits per value in blocks")
    group.add_argument("--block-size", type=positive_integer, metavar="N",
                       help="values per block along the weight's input dimension (default 32; a power of 2, >= 16)")
    group.add_argument("--weight-only-method", choices=("rtn", "gptq", "awq"),
                       help="rtn: nearest rounding (default); gptq: error feedback through the calibration "
                            "inputs' Hessian; awq: activation-aware channel scales and block clipping")
    group.add_argument("--weight-only-format", choices=("qdq", "matmulnbits"),
                       help="qdq: opset-21 blocked DequantizeLinear (default); matmulnbits: com.microsoft "
                            "MatMulNBits (onnxruntime's 4-bit kernels)")
    group.add_argument("--weight-only-asymmetric", action="store_true",
                       help="unsigned blocks with a zero point each (default: signed, zero point 0)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines, only the summary")
    parser.set_defaults(run=run_quantize)
    return parser


def parse_platform(name) -> TargetPlatform:
    """A quantized platform from its name; PlatformError listing the valid names otherwise."""
    valid = ", ".join(p.name.lower() for p in QUANTIZED_PLATFORMS)
    try:
        platform = TargetPlatform.parse(name)
    except PlatformError:
        raise PlatformError(f"unknown platform {name!r}; valid platforms are: {valid}") from None
    if not platform.is_quantized:
        raise PlatformError(f"{platform.name} is not a quantization target; valid platforms are: {valid}")
    return platform


def read_dispatch_table(path: str) -> dict:
    """{op name: label} from a JSON object or from 'op_name LABEL' lines."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as error:
        raise PlatformError(f"cannot read dispatch table {path!r}: {error.strerror}") from None
    if text.lstrip().startswith("{"):
        try:
            table = json.loads(text)
        except json.JSONDecodeError as error:
            raise PlatformError(f"dispatch table {path!r} is not valid JSON: {error}") from None
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in table.items()):
            raise PlatformError(f"dispatch table {path!r} must map op names to 'TARGET' or 'FP32' strings")
        return table
    table = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.replace(",", " ").replace(":", " ").split()
        if len(parts) != 2:
            raise PlatformError(f"dispatch table {path!r} line {number}: expected 'op_name TARGET|FP32', "
                                f"got {line!r}")
        table[parts[0]] = parts[1]
    return table


def build_setting(args, platform):
    from ..optim.setting import QuantizationSetting, QuantizationSettingFactory
    setting = (QuantizationSetting.load(args.setting) if args.setting
               else QuantizationSettingFactory.for_platform(platform))
    changes = {}
    if args.observer:
        changes["activation_observer"] = args.observer.strip().lower()
    if args.recipe:
        changes["recipe"] = args.recipe
    if args.time_budget is not None:
        changes["time_budget_s"] = args.time_budget
    if args.accuracy_target is not None:
        changes["accuracy_target"] = args.accuracy_target
    weight_only = {"weight_only_bits": args.weight_only, "weight_only_block_size": args.block_size,
                   "weight_only_method": args.weight_only_method, "weight_only_format": args.weight_only_format,
                   "weight_only_symmetric": False if args.weight_only_asymmetric else None}
    changes.update({key: value for key, value in weight_only.items() if value is not None})
    if args.dispatch_table:
        changes["dispatching_table"] = {**setting.dispatching_table, **read_dispatch_table(args.dispatch_table)}
    return QuantizationSetting.from_dict({**setting.to_dict(), **changes}) if changes else setting


def image_options(args) -> dict:
    if args.letterbox is not None and (args.crop is not None or args.resize is not None):
        raise CalibrationDataError("--letterbox replaces --resize and --crop (it scales the whole image to fit "
                                   "and pads the rest); give one or the other")
    options = {"resize_shorter": args.resize, "crop": args.crop, "mean": args.mean, "std": args.std,
               "scale": args.scale, "bgr": args.bgr, "layout": args.layout}
    if args.letterbox is not None:
        options.update(letterbox=args.letterbox, letterbox_value=args.letterbox_value)
    return options


def open_calibration(folder: str, graph, batch_size: int, input_shape, options: dict):
    """The CalibrationFolder for ``graph``; warnings it raises are printed as 'ppqlike: warning: ...'."""
    from ..io.calibration_data import CalibrationFolder, InputSpec, input_specs
    specs = input_specs(graph)
    if input_shape is not None:
        if len(specs) != 1:
            raise CalibrationDataError(f"--input-shape is for single-input models; this one has inputs "
                                       f"{[s.name for s in specs]}")
        specs = [InputSpec(specs[0].name, tuple(input_shape), specs[0].dtype)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data = CalibrationFolder(folder, specs, batch_size=batch_size, image_options=options)
    for warning in caught:
        print(f"ppqlike: warning: {warning.message}", file=sys.stderr)
    return data


def load_model_for_quantization(path: str, recalibrate: bool, setting):
    """The model's graph; an already quantized model (QDQ/QOperator) is refused unless ``--recalibrate``."""
    from ..io.load import is_imported, load_graph
    graph = load_graph(path)
    if not is_imported(graph):
        return graph
    if not recalibrate:
        raise PPQLikeError(f"model {path!r} is already quantized (it holds QuantizeLinear/DequantizeLinear or QLinear* "
                           "nodes); see what it holds with `ppqlike inspect`, or pass --recalibrate to quantize its "
                           "float graph again from the calibration data")
    setting.keep_imported_scales = False
    return graph


def batch_size_for(graph, requested: int | None, input_shape) -> int:
    """--batch-size, or the model's fixed batch size when it has one, else 16; a requested size that the
    model's fixed batch dimension contradicts is an error naming the size to use."""
    fixed = {v.name: v.shape[0] for v in graph.inputs
             if input_shape is None and v.shape and isinstance(v.shape[0], int) and v.shape[0] > 0}
    sizes = set(fixed.values())
    if requested is None:
        return sizes.pop() if len(sizes) == 1 else 16
    if sizes and sizes != {requested}:
        name, size = next(iter(fixed.items()))
        raise CalibrationDataError(f"--batch-size {requested}: model input {name!r} has a fixed batch size of "
                                   f"{size}; pass --batch-size {size} (or leave it out)")
    return requested


def run_quantize(args: argparse.Namespace) -> int:
    from ..api import quantize_onnx_model
    from ..executor.ops import check_runnable
    from .output import OutputFolder

    started = time.perf_counter()
    platform = parse_platform(args.platform)
    model = os.path.abspath(args.model)
    if not os.path.exists(model):
        raise ModelLoadError(f"model file {args.model!r} does not exist")
    if not os.path.isfile(model):
        raise ModelLoadError(f"model path {args.model!r} is not a file; give the path of an .onnx file")
    stem = os.path.splitext(os.path.basename(model))[0]
    model_name = args.model_name or f"{stem}.{platform.name.lower()}.onnx"
    if os.path.basename(model_name) != model_name or not model_name:
        raise PPQLikeError(f"--model-name {model_name!r} must be a plain file name, not a path")
    names = {"model": model_name, "config": f"{os.path.splitext(model_name)[0]}.json", "summary": SUMMARY_NAME,
             "report": REPORT_NAME}
    output = OutputFolder(args.out, protect=(model,))
    output.check(list(names.values()))
    setting = build_setting(args, platform)
    setting.validate()
    graph = load_model_for_quantization(model, args.recalibrate, setting)
    check_runnable(graph)  # an op the executor cannot run is named now, before any data is read
    args.batch_size = batch_size_for(graph, args.batch_size, args.input_shape)
    data = open_calibration(args.calib, graph, args.batch_size, args.input_shape, image_options(args))
    if args.calib_steps is not None and args.calib_steps > len(data):
        raise CalibrationDataError(
            f"--calib-steps {args.calib_steps} asks for more batches than the calibration data has: "
            f"{data.describe()}; lower --calib-steps (at most {len(data)}) or --batch-size")
    if not args.quiet:
        print(f"ppqlike: calibrating on {data.describe()}", file=sys.stderr)
    shape = None if args.input_shape is None else [None, *args.input_shape[1:]]
    graph = quantize_onnx_model(graph, data, calib_steps=args.calib_steps, input_shape=shape, platform=platform,
                                setting=setting, dispatcher=args.dispatcher, verbose=0 if args.quiet else 1)
    graph.metadata.setdefault("quantization", {})["source"] = model  # exporters refuse to overwrite it
    calibration = {"folder": os.path.abspath(args.calib), "kind": data.kind, "samples": data.samples,
                   "batch_size": data.batch_size, "batches": len(data),
                   "batches_used": args.calib_steps or len(data), "skipped_files": data.skipped,
                   "description": data.describe()}
    summary = export_folder(graph, platform, output, names, model, started, calibration, report_data=data,
                            verbose=not args.quiet)
    from .output import print_summary
    print_summary(summary)
    return 0


def _quantize_split(metadata: dict) -> dict:
    """The quantization's seconds split: calibration (the calibration pass), the other passes, the rest
    (loading, formatting, dispatch, the verdict)."""
    passes = {p["name"]: p["seconds"] for p in metadata.get("passes", [])}
    calibration = passes.get("calibration", 0.0)
    others = sum(passes.values()) - calibration
    return {"calibration": round(calibration, 3), "passes": round(others, 3),
            "load_and_verdict": round(max(0.0, metadata.get("seconds", 0.0) - calibration - others), 3)}


def export_folder(graph, platform, output, names: dict, source: str, started: float, calibration=None,
                  report_data=None, verbose: bool = False) -> dict:
    """Export ``graph`` into ``output`` (whole or nothing) with a summary.json; returns the summary.

    With a ``'report'`` entry in ``names`` a report.html is written too, its analyses run on the first
    batch of ``report_data`` (see :func:`ppqlike.analysis.quick_report`).
    """
    from .export import export_quantized, exported_states
    from .output import dispatch_counts, peak_memory_mib, write_summary

    quantized_at = time.perf_counter()
    info: dict = {}
    summary: dict = {}

    def produce(staging: str) -> None:
        info.update(export_quantized(graph, platform, os.path.join(staging, names["model"]),
                                     os.path.join(staging, names["config"])))
        extras = sorted(n for n in os.listdir(staging) if n not in names.values() and not n.startswith("."))
        metadata = graph.metadata.get("quantization", {})
        report = None
        if "report" in names:
            from ..analysis import quick_report
            report = quick_report(os.path.join(staging, names["report"]), graph, source,
                                  os.path.join(staging, names["model"]), report_data,
                                  extra={"calibration": (calibration or {}).get("description"),
                                         "exporter": info["exporter"], "export notes": info["notes"]})
            for part, error in report["errors"].items():
                print(f"ppqlike: warning: report: {part} failed: {error}", file=sys.stderr)
            if verbose and report["worst"]:
                print(f"ppqlike: report: worst op {report['worst'][0]} at {report['worst'][1]:.2f} dB SNR "
                      f"(graph-wise, {report['seconds']:.1f} s)", file=sys.stderr)
        finished = time.perf_counter()
        summary.update({
            "model": source, "platform": platform.name, "output_dir": output.path,
            "files": {"model": output.file(names["model"]), "config": output.file(names["config"]),
                      "summary": output.file(names["summary"]),
                      **({"report": output.file(names["report"])} if report else {}),
                      **({"extras": [output.file(n) for n in extras]} if extras else {})},
            "ops": dispatch_counts(graph), "dispatcher": metadata.get("dispatch", {}).get("dispatcher"),
            "config_states": exported_states(graph), "calibration": calibration,
            "exporter": info["exporter"], "export_notes": info["notes"],
            "seconds": {"quantize": round(metadata.get("seconds", 0.0), 3),
                        **_quantize_split(metadata),
                        "export": round(finished - quantized_at - (report["seconds"] if report else 0.0), 3),
                        **({"report": report["seconds"]} if report else {}), "total": round(finished - started, 3)},
            "recipe": metadata.get("recipe"),
            "verdict": metadata.get("verdict"),
            "protected_ops": metadata.get("protected_ops"),
            "moved_to_fp32_for_accuracy_target": metadata.get("mixed_precision_fp32_ops"),
            "moved_to_int16_for_accuracy_target": metadata.get("mixed_precision_int16_ops"),
            **{f"moved_to_{mode}_for_accuracy_target": metadata[f"mixed_precision_{mode}_ops"]
               for mode in ("bf16", "f16") if f"mixed_precision_{mode}_ops" in metadata},
            "passes": [{"name": p["name"], "seconds": p["seconds"]} for p in metadata.get("passes", [])],
            "peak_memory_mib": peak_memory_mib()})
        write_summary(staging, names["summary"], summary)

    output.commit(produce)
    return summary
