"""A rehearsal, here, of the GPU machine's offline install: ``infra/gpu_bundle.sh`` builds the wheels its image lacks,
``infra/gpu_check.sh`` installs them with no network into a throwaway venv over the image's Python.

The image is emulated by a venv whose only third-party packages are the image's (torch, numpy, pandas, pyarrow, onnx,
onnxruntime, scikit-learn, prometheus-client, transformers) and their own dependencies, linked from .venv, never
copied. The bundle is built for this machine's Python (cached under ``.loopline/``), so it installs here.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as metadata
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from packaging import tags
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

#: The integration tier: it builds the bundle's wheels (minutes, the first time) and venvs to install them in.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TARGET = f"{sys.version_info.major}.{sys.version_info.minor}"
CACHE = REPO / ".loopline" / f"gpu-bundle-py{TARGET}"
LIMIT = 60 * 1024 * 1024
#: What the GPU image has installed (transformers and scikit-learn are not in .venv: only what is here is linked).
IMAGE = ("torch", "numpy", "pandas", "pyarrow", "onnx", "onnxruntime", "scikit-learn", "prometheus-client", "transformers")
#: What issue 18 found missing on the image. .venv's transformers 5 requires pydantic (through huggingface-hub 1 and
#: typer); the image's transformers, older, evidently does not: the closure stops there.
ABSENT = {"deepspeed", "pydantic", "hjson", "vllm"}
#: The trainer's import closure, as gpu_check.py runs it (train.py is what torchrun starts).
PROBE = "import offline_training.train, offline_training.launch, loopline.scenarios.gpu_check, online.onnx_runtime"


def run(command: list[str], **env: str) -> subprocess.CompletedProcess:
    # No index, find-links or outer venv leaks in: the GPU machine has none.
    base = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(command, cwd=REPO, env=base | env, capture_output=True, text=True, timeout=600)


def pinned_wheels(folder: Path) -> dict[str, Path]:
    return {canonicalize_name(parse_wheel_filename(wheel.name)[0]): wheel for wheel in folder.glob("*.whl")}


@pytest.fixture(scope="module")
def bundle() -> Path:
    built = run(["infra/gpu_bundle.sh"], GPU_PYTHON_VERSION=TARGET, GPU_BUNDLE_DIR=str(CACHE))
    if built.returncode != 0:
        try:
            urllib.request.urlopen("https://pypi.org/simple/pip/", timeout=10).close()
        except OSError as err:
            pytest.skip(
                f"PyPI unreachable ({err}): the bundle's wheels and DeepSpeed's sdist come from it; {CACHE} is incomplete"
            )
        pytest.fail(f"infra/gpu_bundle.sh failed:\n{built.stdout}{built.stderr}")
    return CACHE


def image_closure(roots: tuple[str, ...] = IMAGE) -> tuple[dict[str, metadata.Distribution], set[str]]:
    """The image's distributions that .venv has and what they require (no extras), recursively, short of what the
    image lacks; and the requirements so cut (``requirer -> requirement``)."""
    found: dict[str, metadata.Distribution] = {}
    cut: set[str] = set()
    todo = [("", name) for name in roots]
    while todo:
        requirer, name = todo.pop()
        name = canonicalize_name(name)
        if name in ABSENT:
            cut.add(f"{requirer} -> {name}")
            continue
        if name in found:
            continue
        try:
            found[name] = dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        for line in dist.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append((name, requirement.name))
    return found, cut


def link_image(closure: dict[str, metadata.Distribution], site: Path) -> None:
    """Symlink each distribution's top-level entries (packages, modules, .libs, its .dist-info) into ``site``; inside a
    namespace folder (``nvidia/``, ``google/``: no ``__init__.py``, shared with other distributions), its own entries."""
    for dist in closure.values():
        root = Path(dist.locate_file(""))
        for file in dist.files or []:
            parts = file.parts
            if parts[0] in ("..", "__pycache__") or parts[0].endswith(".pth"):
                continue
            depth = 2 if len(parts) > 2 and (root / parts[0]).is_dir() and not (root / parts[0] / "__init__.py").exists() else 1
            if depth == 2 and parts[0].endswith((".dist-info", ".libs", ".data")):
                depth = 1
            link = site.joinpath(*parts[:depth])
            if not link.exists():
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(root.joinpath(*parts[:depth]))


def test_the_bundle_is_pinned_small_and_for_the_target_python(bundle: Path) -> None:
    wheels = pinned_wheels(bundle)
    assert set(wheels) >= {"deepspeed", "pydantic", "pydantic-core", "onnxscript", "hjson"}
    for name, wheel in wheels.items():
        _, version, _, wheel_tags = parse_wheel_filename(wheel.name)
        assert str(version) == metadata.version(name), f"{wheel.name}: .venv has {metadata.version(name)}"
        assert wheel_tags & set(tags.sys_tags()), f"{wheel.name} does not install on Python {TARGET}"
        assert all("manylinux" in t.platform or t.platform == "any" for t in wheel_tags), wheel.name
    assert parse_wheel_filename(wheels["deepspeed"].name)[3] == {tags.Tag("py3", "none", "any")}
    assert sum(wheel.stat().st_size for wheel in wheels.values()) < LIMIT
    sums = dict(reversed(line.split()) for line in (bundle / "SHA256SUMS").read_text().splitlines())
    assert sums == {w.name: hashlib.sha256(w.read_bytes()).hexdigest() for w in wheels.values()}
    again = run(["infra/gpu_bundle.sh"], GPU_PYTHON_VERSION=TARGET, GPU_BUNDLE_DIR=str(bundle))
    assert again.returncode == 0 and "downloading" not in again.stdout and "building" not in again.stdout, again.stdout
    over = run(["infra/gpu_bundle.sh"], GPU_PYTHON_VERSION=TARGET, GPU_BUNDLE_DIR=str(bundle), GPU_BUNDLE_LIMIT_MIB="1")
    assert over.returncode != 0 and "over 1 MiB" in over.stderr and not (bundle / "SHA256SUMS").exists()
    assert run(["infra/gpu_bundle.sh"], GPU_PYTHON_VERSION=TARGET, GPU_BUNDLE_DIR=str(bundle)).returncode == 0


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, metadata.Distribution], Path]:
    """The image's distributions (what .venv has of them) and a folder of links to their files."""
    closure, cut = image_closure()
    print("\nimage closure:", " ".join(sorted(closure)), "\ncut:", ", ".join(sorted(cut)))
    site = tmp_path_factory.mktemp("gpu-image") / "site-packages"
    link_image(closure, site)
    return closure, site


def test_the_trainer_imports_offline_on_the_image_with_the_bundle(bundle: Path, image: tuple, tmp_path: Path) -> None:
    closure, site = image
    wheels = pinned_wheels(bundle)
    print("bundled, and in the image too:", " ".join(sorted(set(closure) & set(wheels))))
    assert not {"deepspeed", "pydantic", "hjson", "onnxscript"} & set(closure)
    # The image's Python: a venv of this interpreter's base without its system site-packages (which here has
    # pydantic); the image's packages on its path after the venv's own site-packages, as system site-packages are.
    venv = tmp_path / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", str(venv)], check=True, timeout=300)  # type: ignore[attr-defined]
    python = str(venv / "bin" / "python")
    purelib = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip())
    (purelib / "gpu-image.pth").write_text(f"{site}\n")
    # 3.11's ensurepip adds an old setuptools that would shadow the image's (torch requires one); 3.12's adds none.
    for entry in purelib.iterdir():
        if entry.name.startswith(("setuptools", "pkg_resources", "_distutils_hack", "distutils-precedence")):
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()

    # The control: the image's packages import, and the trainer does not (the emulation hides what the image lacks).
    control = run(
        [python, "-c", f"import numpy, pandas, pyarrow, onnx, onnxruntime, prometheus_client; {PROBE}"], PYTHONPATH=str(REPO)
    )
    assert control.returncode != 0
    assert re.search(r"ModuleNotFoundError: No module named '(deepspeed|pydantic)'", control.stderr), control.stderr[-3000:]

    # As infra/gpu_check.sh installs it: no index, no dependencies resolved.
    install = run([python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", *map(str, wheels.values())])
    assert install.returncode == 0, install.stdout + install.stderr
    probe = run(
        [python, "-c", f"{PROBE}; import deepspeed, pydantic, onnxscript; print(deepspeed.__file__, pydantic.__file__)"],
        PYTHONPATH=str(REPO),
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    assert all(path.startswith(str(purelib)) for path in probe.stdout.split()[-2:]), probe.stdout
    # Every requirement the installed distributions declare is met, by the bundle or the image.
    check = run([python, "-m", "pip", "check"])
    assert check.returncode == 0, check.stdout + check.stderr


def test_gpu_check_sh_installs_the_bundle_where_deepspeed_is_missing(bundle: Path, tmp_path: Path) -> None:
    # The machine's Python lacks DeepSpeed: this one's base interpreter with numpy and pandas (what gpu_check.py
    # imports first) on PYTHONPATH and no torch, so the check, run in the script's throwaway venv, stops early.
    site = tmp_path / "site-packages"
    link_image(image_closure(("numpy", "pandas"))[0], site)
    done = run(["infra/gpu_check.sh"], PYTHON=sys._base_executable, GPU_BUNDLE=str(bundle), PYTHONPATH=str(site))  # type: ignore[attr-defined]
    assert f"wheels from {bundle} installed in " in done.stderr, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # The check ran over the bundle and said what this Python lacks; its status is the script's.
    assert done.returncode == 2 and result["cuda"] is False and "torch is not installed" in result["reason"], (
        done.stdout + done.stderr[-3000:]
    )
