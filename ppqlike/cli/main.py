"""The ``ppqlike`` command line.

``ppqlike quantize`` quantizes an ONNX model on a calibration folder
(:mod:`ppqlike.cli.quantize`); ``ppqlike demo`` runs the embedded default
model end to end.  Every deliberate error prints one line,
``ppqlike: error: ...``, and exits with status 2; no traceback.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import threading
import time
from importlib import resources

import numpy as np

from ..core.errors import PPQLikeError

#: The demo's platform: onnxruntime's QDQ format is what it runs natively (uint8 activations,
#: int8 per-channel weights, rounding half to even), so the exported model computes exactly what
#: the simulation computes.
DEMO_PLATFORM = "ORT_INT8"
DEMO_OUT = "ppqlike-demo-out"


class _UsageError(Exception):
    """A command-line usage error (argparse's), reported as one line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would print the usage and exit; one line and status 2 instead
        raise _UsageError(f"{message} (see '{self.prog} --help')")


def _data_path(name: str) -> str:
    return str(resources.files("ppqlike") / "data" / name)


def load_demo_data(split: str = "test") -> tuple[np.ndarray, np.ndarray]:
    """The bundled digits data of the demo, preprocessed for the demo model: (images [N,1,8,8], labels).

    ``split`` is 'train', 'calibration' or 'test'.
    """
    bundle = np.load(_data_path("digits.npz"))
    key = f"{split}_index"
    if key not in bundle.files:
        raise PPQLikeError(f"unknown demo data split {split!r}; choose 'train', 'calibration' or 'test'")
    index = bundle[key]
    images = bundle["images"][index].astype(np.float32)[:, None] / 16.0 - 0.5
    return images, bundle["labels"][index]


def _batches(images: np.ndarray, size: int) -> list[np.ndarray]:
    return [images[i:i + size] for i in range(0, len(images), size)]


def run_demo(args: argparse.Namespace) -> int:
    """Quantize the embedded model on the calibration split and compare FP32, simulated and exported INT8."""
    import onnxruntime

    from ..api import quantize_onnx_model
    from .output import OutputFolder, print_summary
    from .quantize import export_folder, parse_platform
    from ..executor import NumpyExecutor
    from ..io import load_onnx_graph

    started = time.perf_counter()
    platform = parse_platform(args.platform)
    model_path = _data_path("demo_model.onnx")
    names = {"model": f"demo_model.{platform.name.lower()}.onnx",
             "config": f"demo_model.{platform.name.lower()}.json", "summary": "summary.json"}
    out = args.out if args.out is not None else tempfile.mkdtemp(prefix=DEMO_OUT + "-")
    output = OutputFolder(out, protect=(model_path,))
    output.check(list(names.values()))
    images, labels = load_demo_data("test")
    calibration, _ = load_demo_data("calibration")

    def session_of(path_or_bytes):
        return onnxruntime.InferenceSession(path_or_bytes, providers=["CPUExecutionProvider"])

    def accuracy(logits):
        return float(np.mean(logits.argmax(1) == labels))

    fp32_graph = load_onnx_graph(model_path)
    fp32 = NumpyExecutor(fp32_graph).forward(images)[0]
    reference = session_of(model_path).run(None, {fp32_graph.inputs[0].name: images})[0]
    print(f"demo model: {model_path} ({len(fp32_graph.operations)} ops); {len(calibration)} calibration and "
          f"{len(images)} test images (UCI digits, 8x8)")
    print(f"FP32 accuracy                 executor {accuracy(fp32):.4f}   onnxruntime {accuracy(reference):.4f}   "
          f"top-1 agreement {np.mean(fp32.argmax(1) == reference.argmax(1)):.4f}")

    graph = quantize_onnx_model(model_path, _batches(calibration, 50), platform=platform,
                                verbose=0 if args.quiet else 1)
    simulated = NumpyExecutor(graph).forward(images)[0]
    summary = export_folder(graph, platform, output, names, model_path, started,
                            {"description": f"{len(calibration)} images of the bundled calibration split",
                             "samples": len(calibration), "batches_used": len(_batches(calibration, 50))})
    exported = session_of(summary["files"]["model"])
    deployed = exported.run(None, {exported.get_inputs()[0].name: images})[0]
    scale = max(float(np.abs(simulated).max()), 1e-12)
    print(f"INT8 ({platform.name}) accuracy     simulated {accuracy(simulated):.4f}   "
          f"exported in onnxruntime {accuracy(deployed):.4f}")
    print(f"simulated vs exported         top-1 agreement {np.mean(simulated.argmax(1) == deployed.argmax(1)):.4f}, "
          f"max |difference| {np.abs(simulated - deployed).max():.3g} ({np.abs(simulated - deployed).max() / scale:.2e} "
          f"of the largest logit)")
    print(f"FP32 vs INT8                  top-1 agreement {np.mean(reference.argmax(1) == deployed.argmax(1)):.4f}")
    print_summary(summary)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from .inspect import add_inspect_parser
    from .quantize import add_quantize_parser
    parser = _Parser(prog="ppqlike", description="Post-training quantization of ONNX models, in the style of PPQ. "
                     "Errors print one line 'ppqlike: error: ...' and exit with status 2.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_quantize_parser(commands)
    demo = commands.add_parser("demo", help="quantize the embedded digits model end to end and compare",
                               description=run_demo.__doc__)
    demo.add_argument("--out", default=None, metavar="DIR",
                      help="output folder (default: a new temporary folder, printed at the end; never the "
                           "current folder)")
    demo.add_argument("--platform", default=DEMO_PLATFORM,
                      help=f"target platform (default {DEMO_PLATFORM.lower()}: its QDQ export matches the "
                           "simulation exactly)")
    demo.add_argument("--quiet", action="store_true", help="no per-pass progress lines")
    demo.set_defaults(run=run_demo)
    add_inspect_parser(commands)
    return parser


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


class _Terminated(BaseException):
    """Raised in the main thread on SIGTERM, so that the cleanup an interrupt runs (staging folders and
    temporary files removed, outputs whole or absent) runs for a termination too."""


def _terminate_like_interrupt():
    """Install the SIGTERM handler (main thread only); returns the previous handler, or None."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        raise _Terminated()
    return signal.signal(signal.SIGTERM, handler)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``ppqlike`` console script; returns the exit status."""
    try:
        args = build_parser().parse_args(argv)
    except _UsageError as error:
        print(f"ppqlike: error: {_one_line(error)}", file=sys.stderr)
        return 2
    except SystemExit as exit_:  # --help
        return int(exit_.code or 0)
    previous = _terminate_like_interrupt()
    try:
        return args.run(args)
    except _Terminated:
        print("ppqlike: terminated; nothing was written", file=sys.stderr)
        return 143
    except PPQLikeError as error:
        print(f"ppqlike: error: {_one_line(error)}", file=sys.stderr)
        return 2
    except OSError as error:  # an I/O failure outside ppqlike's own checks
        where = f" {error.filename!r}" if error.filename else ""
        print(f"ppqlike: error:{where} {error.strerror or error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ppqlike: interrupted; nothing was written", file=sys.stderr)
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
