#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU, DeepSpeed ZeRO 1-3 on CUDA, the memory plan and KV cache against
# plan-gpu, ONNX Runtime and the real-vLLM test where its environment is; exits 0 only when every part passes; prints one
# JSON line (loopline/scenarios/gpu_check.py). Needs torch and the train extra (pip install -e '.[cpu,train]', or
# '.[gpu,train]' for ONNX Runtime's CUDA provider), or the bundle below.
#   infra/gpu_check.sh            (PYTHON=... to use another interpreter; default .venv/bin/python if present)
# Where that Python lacks DeepSpeed (a GPU machine with no network), the wheels infra/gpu_bundle.sh built here,
# carried as .loopline/gpu-bundle (or GPU_BUNDLE=dir), are installed offline into a throwaway folder on its path first.
set -euo pipefail
[[ -z ${GPU_BUNDLE:-} ]] || GPU_BUNDLE=$(realpath -e "$GPU_BUNDLE") # one named must be there
cd "$(dirname "$0")/.."
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >&2 || echo "nvidia-smi: not found" >&2
# Where the repository is not pip-installed (the GPU machine gets a copy of the tree), its root is on the path.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
bundle=${GPU_BUNDLE:-.loopline/gpu-bundle}
if ! "$PYTHON" -c "import deepspeed, onnxscript" 2>/dev/null && [[ -d $bundle ]]; then
  # A bundle cut short (in its build or in transit) fails here, not mid-check.
  (cd "$bundle" && sha256sum --quiet -c SHA256SUMS) || { echo "gpu_check: $bundle is incomplete: make gpu-bundle" >&2; exit 1; }
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  # Into a folder first on PYTHONPATH, not a venv: the machine's Python (a venv itself or not) keeps its own packages,
  # torch's CUDA build among them, and the bundle's pinned wheels come before them (--no-deps and --no-index: the
  # bundle is the rest of the closure, and nothing is fetched; --no-compile: imports do).
  if ! "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check --target "$tmp/site" \
      "$bundle"/*.whl >&2; then
    for wheel in "$bundle"/*.whl; do "$PYTHON" -m zipfile -e "$wheel" "$tmp/site"; done # no pip: a wheel is a zip of them
  fi
  export PYTHONPATH="$tmp/site:$PYTHONPATH" # the trainer's workers and the probes inherit it
  echo "gpu_check: $(ls "$bundle"/*.whl | wc -l) wheels from $bundle installed in $tmp/site" >&2
  # Not exec, so the trap removes them; under set -e a failing check's status is the script's.
  "$PYTHON" -m loopline.scenarios.gpu_check "$@"
  exit 0
fi
# With neither DeepSpeed nor a bundle the check still runs, and reports what is missing.
exec "$PYTHON" -m loopline.scenarios.gpu_check "$@"
