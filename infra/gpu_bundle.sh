#!/usr/bin/env bash
# The GPU check's offline wheels: the GPU machine has no network, and its image has torch, numpy, pandas, pyarrow,
# onnx, onnxruntime (CPU), scikit-learn, prometheus-client and transformers, but not DeepSpeed, pydantic or the
# ONNX exporter's onnxscript. This builds, here, the wheels the trainer's import closure needs beyond the image
# (offline_training/, schemas/, feedback_loop/snapshots.py, online/onnx_runtime.py), each pinned to the version
# .venv has installed (the one the tests here ran), for the GPU machine's Python on manylinux x86_64. Carry the
# folder to the GPU machine (.loopline/gpu-bundle, git-ignored); infra/gpu_check.sh installs it there offline.
#   infra/gpu_bundle.sh      (GPU_PYTHON_VERSION=3.12 the target; GPU_BUNDLE_DIR=.loopline/gpu-bundle the folder;
#                             PYTHON=.venv/bin/python the interpreter whose packages are pinned and that builds)
# Cached: a wheel already there is kept; wheels for other versions or targets are removed. SHA256SUMS, written last,
# lists the bundle. Fails when the bundle is over 60 MiB (GPU_BUNDLE_LIMIT_MIB): a device run carries at most 64 MiB.
set -euo pipefail
[[ -z ${GPU_BUNDLE_DIR:-} ]] || GPU_BUNDLE_DIR=$(realpath -m "$GPU_BUNDLE_DIR")
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
V=${GPU_PYTHON_VERSION:-3.12}
OUT=${GPU_BUNDLE_DIR:-.loopline/gpu-bundle}
LIMIT_MIB=${GPU_BUNDLE_LIMIT_MIB:-60}
# DeepSpeed and what it requires (hjson, msgpack, einops, psutil: imported with it; py-cpuinfo, ninja: its op
# builders'), pydantic (train_config.py, schemas/) and its own, tqdm, pyyaml, fsspec, and torch.onnx.export's
# onnxscript with its own. typing-extensions, packaging, fsspec, ml-dtypes, pyyaml and tqdm the image has too (torch's,
# onnx's, onnxruntime's, transformers' requirements) at versions of its own, maybe older than these need (pydantic:
# typing-extensions >= 4.16): every wheel is bundled and installed; one the image has at that version pip skips.
PACKAGES=(deepspeed hjson py-cpuinfo ninja msgpack einops psutil pydantic pydantic-core annotated-types
  typing-inspection typing-extensions tqdm pyyaml fsspec onnxscript onnx-ir ml-dtypes packaging)

mkdir -p "$OUT"
exec 9>"$OUT/.lock" && flock 9 # one build at a time per folder (tests may run concurrently)
rm -f "$OUT/SHA256SUMS"
# The pins (name==version from .venv's metadata); the ones with no fitting wheel in $OUT yet; stale wheels removed.
missing=$("$PYTHON" - "$OUT" "$V" "${PACKAGES[@]}" <<'EOF'
import importlib.metadata as metadata, pathlib, sys
from packaging import tags
from packaging.utils import canonicalize_name, parse_wheel_filename

out, version, names = pathlib.Path(sys.argv[1]), tuple(map(int, sys.argv[2].split("."))), sys.argv[3:]
platforms = ["manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64"] + [f"manylinux_2_{g}_x86_64" for g in range(5, 29)]
cp = f"cp{version[0]}{version[1]}"
fits = {*tags.cpython_tags(version, [cp], platforms), *tags.compatible_tags(version, cp, platforms)}
try:
    pins = {canonicalize_name(n): metadata.version(n) for n in names}
except metadata.PackageNotFoundError as err:
    sys.exit(f"gpu_bundle: {err} is not installed in {sys.executable}: make setup (the train extra)")
have = set()
for wheel in out.glob("*.whl"):
    name, ver, _, wheel_tags = parse_wheel_filename(wheel.name)
    if pins.get(name) == str(ver) and wheel_tags & fits:
        have.add(name)
    else:
        print(f"gpu_bundle: removing {wheel.name} (not pinned, or not for {cp})", file=sys.stderr)
        wheel.unlink()
print(" ".join(f"{name}=={ver}" for name, ver in pins.items() if name not in have))
EOF
)
read -ra MISSING <<<"$missing"

for pin in "${MISSING[@]}"; do
  if [[ $pin == deepspeed==* ]]; then
    # PyPI has only DeepSpeed's sdist. Built without compiled ops (they JIT-compile where used), the wheel is pure
    # Python, whatever the target Python; its setup.py imports torch, hence no build isolation.
    echo "gpu_bundle: building $pin (DS_BUILD_OPS=0)"
    build=$(mktemp -d)
    DS_BUILD_OPS=0 "$PYTHON" -m pip wheel -q --no-deps --no-build-isolation -w "$build" "$pin"
    wheel=$(ls "$build"/deepspeed-*.whl)
    [[ $wheel == *-py3-none-any.whl ]] || { echo "gpu_bundle: $wheel is not pure Python (py3-none-any)" >&2; exit 1; }
    mv "$wheel" "$OUT/" && rm -rf "$build"
  fi
done
DOWNLOADS=()
for pin in "${MISSING[@]}"; do [[ $pin == deepspeed==* ]] || DOWNLOADS+=("$pin"); done
if ((${#DOWNLOADS[@]})); then
  echo "gpu_bundle: downloading ${DOWNLOADS[*]} (cp${V/./}, manylinux x86_64)"
  "$PYTHON" -m pip download -q --only-binary=:all: --no-deps -d "$OUT" --python-version "$V" --implementation cp \
    --abi "cp${V/./}" --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 "${DOWNLOADS[@]}"
fi

count=$(ls "$OUT"/*.whl | wc -l)
[[ $count == "${#PACKAGES[@]}" ]] || { echo "gpu_bundle: $count wheels in $OUT, ${#PACKAGES[@]} expected" >&2; exit 1; }
bytes=$(cat "$OUT"/*.whl | wc -c)
echo "gpu_bundle: $count wheels, $((bytes / 1024)) KiB in $OUT (for Python $V)"
if ((bytes > LIMIT_MIB * 1024 * 1024)); then
  echo "gpu_bundle: the bundle is over $LIMIT_MIB MiB: it would not fit a device run's 64 MiB carry" >&2
  exit 1
fi
(cd "$OUT" && sha256sum -- *.whl >SHA256SUMS.tmp && mv SHA256SUMS.tmp SHA256SUMS)
