"""`make images`: Loopline's images (``infra/images/catalog.py``) built here with podman, from what this machine has.

    python -m loopline.images [KEY ...] [--all]     # default: every image but those built on request (the trainer)

Each image holds exactly the versions of the project's venv (the ones the test suite ran): its requirement sets are
pinned from what is installed here. Without a registry the bases are made here too: a Debian bookworm base by
debootstrap, and on it a stand-in for Flink's official image (Java 17, Flink's distribution from PyFlink). Podman's
layer cache keeps what did not change: a second run rebuilds nothing, a code change only the wheel's layer on.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

from infra.flink_cluster import pyflink_home
from infra.images.base import PYTHON_FULL_VERSION, ensure_base
from infra.images.catalog import CUDA_MAJOR, Image, catalog
from infra.images.context import IMAGES_DIR, stage_context
from infra.images.engine import IMAGE_COMMANDS, Podman
from infra.jars import flink_connector_jar
from infra.system_packages import ensure_packages
from loopline.components import feature_operators_jar, joiner_operators_jar
from loopline.project import project_or_template
from loopline.settings import Settings
from streams.job_archives import pinned_requirements

#: The host's CA bundle: pip inside a build reaches the package index only with it, mounted as a build secret.
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Built:
    """One image after `make images`: how long its build took (seconds; a cached one takes a few) and its size."""

    reference: str
    seconds: float
    size_bytes: int


def engine(settings: Settings) -> Podman:
    """Podman with Loopline's engine configuration under ``<home>/containers`` (written if missing)."""
    podman = Podman(settings.home.absolute() / "containers")
    podman.configure()
    return podman


def requirement_sets(python_full_version: str = PYTHON_FULL_VERSION) -> dict[str, list[str]]:
    """The pinned requirement sets the Dockerfiles install (Loopline itself comes as its wheel, PyFlink's jars as the
    Flink image's distribution): ``core`` (the scorer, the monitor and the Flink image: with the cpu extra's
    onnxruntime), ``cuda`` (Loopline's core dependencies alone: the image adds onnxruntime-gpu, which writes the same
    ``onnxruntime`` package) and ``train`` (core with the train extra: torch, DeepSpeed)."""

    def pinned(root: str) -> list[str]:
        lines = pinned_requirements(python_full_version, [root], ["apache-flink-libraries"])
        return [line for line in lines if not line.startswith("loopline==")]

    return {"core": pinned("loopline[cpu]"), "cuda": pinned("loopline"), "train": pinned("loopline[cpu,train]")}


def build_images(settings: Settings, keys: list[str]) -> list[Built]:
    """Build the catalog's images ``keys`` (with the bases they need) and return each one's time and size."""
    ensure_packages(IMAGE_COMMANDS)
    podman = engine(settings)
    work = settings.home.absolute() / "images"
    python_base, _ = ensure_base(podman, work)
    context = stage_context(
        work / "context",
        repo=REPO,
        flink_home=pyflink_home(),
        jars=[flink_connector_jar(settings.resolved_jars_dir), feature_operators_jar(settings), joiner_operators_jar(settings)],
        requirements=requirement_sets(),
        project=project_or_template(settings.project),
    )
    secrets = [("cabundle", CA_BUNDLE)]
    bases = {"python": python_base}
    images = catalog()
    if any(images[key].base == "flink" for key in keys):
        bases["flink"] = f"loopline-flink-base:{version('apache-flink')}-java17"
        podman.build(IMAGES_DIR / "flink-base.Dockerfile", context, bases["flink"], {"BASE_IMAGE": python_base})
    built = []
    for key in keys:
        image: Image = images[key]
        started = time.monotonic()
        podman.build(
            IMAGES_DIR / image.dockerfile,
            context,
            image.reference,
            {"BASE_IMAGE": bases[image.base], **dict(image.build_args)},
            target=image.target,
            secrets=secrets,
        )
        built.append(Built(image.reference, time.monotonic() - started, podman.size_bytes(image.reference)))
    return built


def main(argv: list[str] | None = None) -> None:
    """Build the images named (catalog keys), or all but the on-request ones; print each one's time and size."""
    images = catalog()
    parser = argparse.ArgumentParser(prog="python -m loopline.images", description=__doc__.split("\n\n")[0])
    parser.add_argument("keys", nargs="*", metavar="KEY", help=f"of {', '.join(images)}")
    parser.add_argument("--all", action="store_true", help="every image, the on-request ones too (the trainer)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.keys) - set(images))
    if unknown:
        parser.error(f"no image {', '.join(unknown)} in the catalog (infra/images/catalog.py): {', '.join(images)}")
    keys = args.keys or [key for key, image in images.items() if args.all or not image.on_request]
    started = time.monotonic()
    for built in build_images(Settings(), keys):
        print(f"{built.reference:<56} {built.seconds:7.1f} s {built.size_bytes / 1e9:6.2f} GB")
    print(f"images built in {time.monotonic() - started:.0f} s (CUDA {CUDA_MAJOR} images need an NVIDIA host to score on a GPU)")


if __name__ == "__main__":
    main()
