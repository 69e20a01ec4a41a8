#!/usr/bin/env bash
# The prepared GPU check: one command on one GPU (an H200 is what it is sized for), under 8 minutes.
# Trains winnow's bf16 MoE of ~1.04B total / 0.25B active parameters for 300 timed steps (after 20
# warm-up steps) through the real Trainer and prints tokens/s, MFU on active parameters (H200 dense
# bf16 peak: 989 TFLOP/s) and peak memory. Installs nothing: it runs from this checkout with the
# torch already in the environment. Extra arguments go to bench/gpu.py (e.g. --steps 100, or
# --preset tiny --device cpu to walk the same path on a CPU, as tests/bench/test_gpu_check.py does).
# PYTHON names the interpreter (default: the first python on PATH, e.g. an activated venv's).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PYTHON="${PYTHON:-python}"
"$PYTHON" -c "import torch; print(f'torch {torch.__version__}, cuda available: {torch.cuda.is_available()}', (torch.cuda.get_device_name(0) if torch.cuda.is_available() else ''))"
timeout "${WINNOW_GPU_TIMEOUT:-460}" "$PYTHON" bench/gpu.py "$@"
