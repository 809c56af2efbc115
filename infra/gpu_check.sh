#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU, a few DeepSpeed training steps on CUDA, the trained model
# scored through ONNX Runtime's CUDA provider, and the real-vLLM test where its environment is; prints one
# JSON line (loopline/scenarios/gpu_check.py). Needs the train and gpu extras: pip install -e '.[train,gpu]'.
#   infra/gpu_check.sh            (PYTHON=... to use another interpreter; default .venv/bin/python if present)
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >&2 || echo "nvidia-smi: not found" >&2
exec "$PYTHON" -m loopline.scenarios.gpu_check
