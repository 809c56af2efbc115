"""The Flink jobs' entry in a Loopline Flink image: what a FlinkDeployment's PythonDriver runs
(``--pyModule loopline.flink_image_job <job> <parallelism>``, as ``loopline stream submit --print-command --image``
prints it).

The job's settings are read where it runs, from the pod's environment (``LOOPLINE_CONFIG`` and ``LOOPLINE_*``, the
Secrets' passwords among them) like every other Loopline process's, so a FlinkDeployment's arguments carry no address
and no secret; the jars are the image's (``streams/flink_submit.FlinkImage``, in the lib of its ``FLINK_HOME``, which
every Flink image sets). The job module then runs exactly as under a shipped ``flink run``, given the settings as JSON.
"""

from __future__ import annotations

import dataclasses
import os
import runpy
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streams.flink_submit import FlinkImage

#: This module, as ``--pyModule`` names it.
IMAGE_ENTRY_MODULE = "loopline.flink_image_job"
#: The jobs it runs, by the argument that names each.
FEATURE_JOB = "features"
JOINER = "joiner"


def job_arguments(job: str, parallelism: int, image: FlinkImage | None = None) -> tuple[str, list[str]]:
    """The module of ``job`` and the arguments its ``__main__`` takes, from the settings in force here, at ``parallelism``
    (the submission's: a FlinkDeployment's ``job.parallelism``), with the jars of ``image`` (default: the image's layout,
    Flink where its ``FLINK_HOME`` says)."""
    from loopline.components import job_settings, joiner_settings
    from loopline.settings import Settings
    from streams.flink_submit import FlinkImage

    settings = Settings()
    image = image or FlinkImage(flink_home=Path(os.environ.get("FLINK_HOME", FlinkImage.flink_home)))
    # On a cluster, metrics reporters are the cluster's own configuration, not a port of the job's.
    if job == FEATURE_JOB:
        features = dataclasses.replace(job_settings(settings, image), metrics_port=None, parallelism=parallelism)
        return "streams.feature_job", [features.to_json()]
    if job == JOINER:
        joiner = dataclasses.replace(joiner_settings(settings, image), metrics_port=None, parallelism=parallelism)
        return "feedback_loop.joiner_job", [joiner.to_json()]
    raise SystemExit(f"unknown job {job!r}: give {FEATURE_JOB} or {JOINER}")


def main(job: str, parallelism: str) -> None:
    """Run ``job``'s module as its ``__main__``, as ``flink run --pyModule`` would, with the arguments of the settings here."""
    module, arguments = job_arguments(job, int(parallelism))
    sys.argv = [module, *arguments]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(*sys.argv[1:3])
