#!/usr/bin/env bash
# The peers' venv: NNCF, NVIDIA ModelOpt (ONNX PTQ) and AMD Quark (ONNX PTQ), for bench/run.py's peer rows
# (--tools nncf,modelopt,quark).  Benchmark-only: ppqlike never imports them.  CPU only.
#
#   bash bench/peers_venv.sh [VENV]          # default VENV: ../peers-venv beside the repository
#
# One venv for all three: their onnx pins meet at onnx 1.21 (ModelOpt's [onnx] extra: onnx~=1.21.0; Quark:
# onnx>=1.21,<=1.22) and onnxruntime 1.24 (ModelOpt: ~=1.24.2; Quark's cli extra: <=1.28).  ModelOpt's [onnx]
# extra is installed by hand without its two CUDA packages (cupy-cuda12x and onnxruntime-gpu, which its Linux
# x86 markers pick): the plain onnxruntime gives the same `onnxruntime` module with the CPU provider.  torch
# (a ModelOpt requirement) is the CPU build.
set -euo pipefail
VENV=${1:-$(cd "$(dirname "$0")/../.." && pwd)/peers-venv}
python3 -m venv "$VENV"
PIP="$VENV/bin/pip"
"$PIP" install -q --upgrade pip
"$PIP" install -q "torch==2.13.0+cpu"
"$PIP" install -q "onnx==1.21.0" "onnxruntime==1.24.4" "numpy<2.5" pillow
"$PIP" install -q "nncf==3.4.0"
"$PIP" install -q "nvidia-modelopt==0.47.0" cppimport lief ml_dtypes "onnx-graphsurgeon>=0.6.1" \
    "onnxconverter-common~=1.16.0" onnxscript "onnxslim>=0.1.76" "polygraphy>=0.53.4"
"$PIP" install -q "amd-quark==0.13"
# pins again, in case a later install moved one
"$PIP" install -q "onnx==1.21.0" "onnxruntime==1.24.4"
"$PIP" check || true
"$VENV/bin/python" - <<'PY'
import importlib.metadata as m
for name in ("torch", "onnx", "onnxruntime", "numpy", "nncf", "nvidia-modelopt", "amd-quark"):
    print(f"{name} {m.version(name)}")
PY
