#!/usr/bin/env bash
# Start vLLM's OpenAI-compatible server (continuous batching) for Loopline's scorer to call.
#   infra/vllm/serve.sh [PORT] [SERVED_NAME]      (env: ENV_DIR, MODEL_DIR as in setup.sh)
# Then: LOOPLINE_SERVING__LLM='{"base_url": "http://127.0.0.1:PORT/v1", "served_model": "SERVED_NAME",
#        "inputs": [...], "prompt": "..."}' loopline serve
set -euo pipefail
cd "$(dirname "$0")/../.."
PORT=${1:-8000}
SERVED_NAME=${2:-loopline-tiny}
ENV_DIR=${ENV_DIR:-.loopline/vllm-env}
MODEL_DIR=${MODEL_DIR:-.loopline/vllm-model}
[[ -x "$ENV_DIR/bin/vllm" ]] || { echo "no vLLM environment at $ENV_DIR: run infra/vllm/setup.sh" >&2; exit 1; }

# --max-logprobs covers the tiny model's whole vocabulary; --enforce-eager skips CUDA graph capture
# (a much faster start for a model this small).
exec "$ENV_DIR/bin/vllm" serve "$MODEL_DIR" --served-model-name "$SERVED_NAME" \
  --host 127.0.0.1 --port "$PORT" --max-model-len 256 --max-logprobs 64 \
  --gpu-memory-utilization "${GPU_MEMORY_UTILIZATION:-0.2}" --enforce-eager
