#!/usr/bin/env bash
# The vLLM environment: vLLM pins its own torch (and cannot share Loopline's environment), so it
# gets a virtual environment of its own, and a tiny LLM built here (no hub download) to serve.
#   infra/vllm/setup.sh [ENV_DIR] [MODEL_DIR]     (defaults: .loopline/vllm-env .loopline/vllm-model)
# Needs a CUDA GPU to serve; the install itself runs anywhere with PyPI.
set -euo pipefail
cd "$(dirname "$0")/../.."
ENV_DIR=${1:-.loopline/vllm-env}
MODEL_DIR=${2:-.loopline/vllm-model}
PYTHON=${PYTHON:-python3}

if [[ ! -x "$ENV_DIR/bin/vllm" ]]; then
  "$PYTHON" -m venv "$ENV_DIR"
  "$ENV_DIR/bin/pip" install -q --upgrade pip
  "$ENV_DIR/bin/pip" install -q "vllm==0.33.*"
fi
if [[ ! -f "$MODEL_DIR/config.json" ]]; then
  "$ENV_DIR/bin/python" infra/vllm/tiny_model.py "$MODEL_DIR"
fi
echo "vLLM environment: $ENV_DIR; model: $MODEL_DIR"
