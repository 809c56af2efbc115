"""The catalog of Loopline's images: each one's name and its tag, made of the versions it carries. `make images`, the
image tests and the Helm chart (``infra/helm/loopline/``) read it; ``python -m infra.images.catalog`` prints it as JSON.

The versions are those of the environment the images are built from (the project's venv, which the test suite ran):
Loopline's and onnxruntime-gpu's (the gpu extra's exact pin) from ``pyproject.toml``, PyFlink's and torch's as
installed. The CUDA major is the one PyPI's wheels are built for: torch 2.15's default wheel pulls the
``nvidia-*-cu13`` libraries, and onnxruntime-gpu 1.31's ``cuda`` and ``cudnn`` extras ask for CUDA 13 and cuDNN 9 for
CUDA 13.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
#: Debian bookworm's python3, and the slim public base's.
PYTHON = "3.11"
CUDA_MAJOR = "13"


@dataclass(frozen=True)
class Image:
    """One image: its catalog key, name and tag, and how it is built: its Dockerfile (under ``infra/images/``), the
    stage of it that is this image, the base it starts from (``python`` or ``flink``: a public image elsewhere, one made
    here without a registry) and its build arguments. ``on_request``: `make images` builds it only when asked."""

    key: str
    name: str
    tag: str
    dockerfile: str
    base: str
    target: str | None = None
    build_args: tuple[tuple[str, str], ...] = ()
    on_request: bool = False

    @property
    def reference(self) -> str:
        """``name:tag``."""
        return f"{self.name}:{self.tag}"


def loopline_version() -> str:
    """The version ``pyproject.toml`` declares."""
    return tomllib.loads(PYPROJECT.read_text())["project"]["version"]


def onnxruntime_gpu_version() -> str:
    """The onnxruntime-gpu version ``pyproject.toml``'s gpu extra pins, exactly: the venv here holds the CPU build, so
    the CUDA image's version cannot come from what is installed, as the others' do."""
    for line in tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]["gpu"]:
        requirement = Requirement(line)
        if canonicalize_name(requirement.name) == "onnxruntime-gpu":
            (specifier,) = requirement.specifier
            if specifier.operator != "==" or "*" in specifier.version:
                raise ValueError(f"pyproject.toml's gpu extra pins {line!r}: the CUDA image needs an exact version (==X.Y.Z)")
            return specifier.version
    raise ValueError("pyproject.toml's gpu extra pins no onnxruntime-gpu")


def catalog() -> dict[str, Image]:
    """Every image by its catalog key."""
    v, py = loopline_version(), f"py{PYTHON}"
    flink, torch = version("apache-flink"), version("torch").split("+")[0]
    gpu = (("REQUIREMENTS", "cuda"), ("EXTRA", f"onnxruntime-gpu[cuda,cudnn]=={onnxruntime_gpu_version()}"))
    images = [
        Image("loopline-flink", "loopline-flink", f"{v}-flink{flink}-{py}", "flink.Dockerfile", "flink"),
        Image("loopline-scorer-cpu", "loopline-scorer", f"{v}-{py}-cpu", "loopline.Dockerfile", "python", "scorer"),
        Image(
            "loopline-scorer-cuda",
            "loopline-scorer",
            f"{v}-{py}-cuda{CUDA_MAJOR}",
            "loopline.Dockerfile",
            "python",
            "scorer",
            gpu,
        ),
        Image("loopline-ops", "loopline-ops", f"{v}-{py}", "loopline.Dockerfile", "python", "ops"),
        Image(
            "loopline-trainer",
            "loopline-trainer",
            f"{v}-torch{torch}-cuda{CUDA_MAJOR}-{py}",
            "loopline.Dockerfile",
            "python",
            "trainer",
            (("REQUIREMENTS", "train"),),
            on_request=True,
        ),
    ]
    return {image.key: image for image in images}


def image_tags() -> dict[str, str]:
    """``{catalog key: name:tag}``, e.g. ``{"loopline-scorer-cpu": "loopline-scorer:0.1.0-py3.11-cpu", ...}``."""
    return {key: image.reference for key, image in catalog().items()}


if __name__ == "__main__":
    print(json.dumps(image_tags(), indent=2))
