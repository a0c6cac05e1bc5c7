"""The ``ppqlike`` command line.

``ppqlike demo`` runs the embedded default model end to end.
"""

from __future__ import annotations

import argparse
import sys
from importlib import resources

import numpy as np

from .core.errors import PPQLikeError


def _data_path(name: str) -> str:
    return str(resources.files("ppqlike") / "data" / name)


def load_demo_data(split: str = "test") -> tuple[np.ndarray, np.ndarray]:
    """The bundled digits data of the demo, preprocessed for the demo model: (images [N,1,8,8], labels)."""
    bundle = np.load(_data_path("digits.npz"))
    index = bundle[f"{split}_index"]
    images = bundle["images"][index].astype(np.float32)[:, None] / 16.0 - 0.5
    return images, bundle["labels"][index]


def run_demo(args: argparse.Namespace) -> int:
    """FP32 executor against onnxruntime on the embedded model; prints accuracy and agreement."""
    import onnxruntime

    from .executor import NumpyExecutor
    from .io import load_onnx_graph

    model_path = _data_path("demo_model.onnx")
    images, labels = load_demo_data("test")
    graph = load_onnx_graph(model_path)
    ours = NumpyExecutor(graph).forward(images)[0]
    session = onnxruntime.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    reference = session.run(None, {session.get_inputs()[0].name: images})[0]
    difference = float(np.max(np.abs(ours - reference)) / max(np.max(np.abs(reference)), 1e-12))
    print(f"demo model: {model_path} ({len(graph.operations)} ops), {len(images)} test images")
    print(f"FP32 accuracy  executor {np.mean(ours.argmax(1) == labels):.4f}   "
          f"onnxruntime {np.mean(reference.argmax(1) == labels):.4f}")
    print(f"executor vs onnxruntime: top-1 agreement {np.mean(ours.argmax(1) == reference.argmax(1)):.4f}, "
          f"max relative difference {difference:.2e}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ppqlike", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run the embedded default model end to end")
    demo.set_defaults(run=run_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``ppqlike`` console script."""
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except PPQLikeError as error:
        print(f"ppqlike: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
