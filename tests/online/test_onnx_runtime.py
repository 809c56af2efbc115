"""The GPU path's defaults, checked on a CPU machine: which ONNX Runtime build each extra installs (and the CUDA image's),
the scorer's warning when a GPU host scores on the CPU, one training process per visible GPU, and deterministic cuBLAS
in the training workers' environment."""

from __future__ import annotations

import logging
import os
import stat
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
from packaging.requirements import Requirement

from infra.images.catalog import PYPROJECT, catalog, onnxruntime_gpu_version
from loopline.settings import Settings
from offline_training import launch
from online import onnx_runtime
from online.onnx_runtime import OnnxModel
from schemas.model_contract import INPUT_NAME, OUTPUT_NAME, ModelInput, features_metadata

ONNX_RUNTIMES = {"onnxruntime", "onnxruntime-gpu"}


def _project() -> dict:
    return tomllib.loads(PYPROJECT.read_text())["project"]


def _runtimes(lines: list[str]) -> list[Requirement]:
    return [requirement for requirement in map(Requirement, lines) if requirement.name in ONNX_RUNTIMES]


def test_onnx_runtime_comes_with_exactly_one_extra_cpu_or_gpu() -> None:
    project = _project()
    assert _runtimes(project["dependencies"]) == [], (
        "both builds write the `onnxruntime` package: neither may be a core dependency"
    )
    extras = project["optional-dependencies"]
    cpu, gpu = _runtimes(extras["cpu"]), _runtimes(extras["gpu"])
    assert [r.name for r in cpu] == ["onnxruntime"] and [r.name for r in gpu] == ["onnxruntime-gpu"]
    for name, lines in extras.items():
        if name not in ("cpu", "gpu"):
            assert _runtimes(lines) == [], f"the {name} extra would install an ONNX Runtime beside cpu's or gpu's"
    # The CUDA scorer image installs the gpu extra's version (its one source), an exact pin that pip accepts as such.
    (specifier,) = gpu[0].specifier
    assert specifier.operator == "==" and onnxruntime_gpu_version() == specifier.version
    assert dict(catalog()["loopline-scorer-cuda"].build_args)["EXTRA"] == f"onnxruntime-gpu[cuda,cudnn]=={specifier.version}"


def test_the_cpu_images_carry_the_cpu_onnxruntime_and_the_cuda_scorer_does_not() -> None:
    from loopline.images import requirement_sets

    sets = {key: {line.split("==")[0] for line in lines} for key, lines in requirement_sets().items()}
    assert "onnxruntime" in sets["core"] and "onnxruntime" in sets["train"]
    assert sets["cuda"].isdisjoint(ONNX_RUNTIMES)  # the image adds onnxruntime-gpu on top (its EXTRA)
    assert sets["core"] - sets["cuda"] <= {"onnxruntime", "flatbuffers"}  # the CPU build and what only it needs


def _model(path: Path) -> Path:
    """A two-input logistic regression following the model contract."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = numpy_helper.from_array(np.asarray([[0.5], [-0.25]], dtype=np.float32), "w")
    axes = numpy_helper.from_array(np.asarray([1], dtype=np.int64), "axes")
    nodes = [
        helper.make_node("MatMul", [INPUT_NAME, "w"], ["z"]),
        helper.make_node("Sigmoid", ["z"], ["p"]),
        helper.make_node("Squeeze", ["p", "axes"], [OUTPUT_NAME]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["batch", 2])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["batch"])],
        initializer=[weights, axes],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="loopline-tests")
    model.ir_version = 8
    helper.set_model_props(model, features_metadata([ModelInput("request:amount"), ModelInput("txn:count_1h")]))
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _model(tmp_path_factory.mktemp("gpu-path") / "model.onnx")


def test_a_host_that_looks_like_a_gpu_host_but_scores_on_the_cpu_is_warned(model_path, monkeypatch, caplog) -> None:
    # This machine's ONNX Runtime is the CPU build (the cpu extra); only the GPU detection is faked.
    monkeypatch.setattr(onnx_runtime, "gpu_visible", lambda: True)
    with caplog.at_level(logging.WARNING, logger=onnx_runtime.__name__):
        model = OnnxModel(model_path, "fraud", "7", warmup_batch_sizes=(1,))
    assert model.provider == "CPUExecutionProvider"
    (warning,) = [record for record in caplog.records if record.name == onnx_runtime.__name__]
    assert warning.levelno == logging.WARNING
    assert "fraud v7 scores on CPUExecutionProvider" in warning.getMessage() and "loopline[gpu]" in warning.getMessage()
    assert model.predict(np.asarray([[2.0, 4.0]], dtype=np.float32), np.zeros((1, 0), dtype=object)) == pytest.approx([0.5])


def test_a_cpu_host_scores_on_the_cpu_without_a_warning(model_path, monkeypatch, caplog) -> None:
    monkeypatch.setattr(onnx_runtime, "gpu_visible", lambda: False)
    with caplog.at_level(logging.WARNING, logger=onnx_runtime.__name__):
        OnnxModel(model_path, "fraud", "7", warmup_batch_sizes=(1,))
    assert [record for record in caplog.records if record.name == onnx_runtime.__name__] == []


def test_without_onnx_runtime_the_error_names_the_extras(model_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # what `import onnxruntime` meets when neither is installed
    with pytest.raises(ImportError, match=r"pip install 'loopline\[cpu\]', or 'loopline\[gpu\]'"):
        OnnxModel(model_path, "fraud", "7")


@pytest.fixture
def bin_dir(tmp_path, monkeypatch) -> Path:
    """PATH with only an empty folder: no nvidia-smi unless a test writes one there."""
    folder = tmp_path / "bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", str(folder))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return folder


def _nvidia_smi(folder: Path, gpus: int) -> None:
    """An nvidia-smi that lists ``gpus`` GPUs for ``-L``, as the real one does."""
    script = folder / "nvidia-smi"
    lines = "".join(f"echo 'GPU {i}: NVIDIA H200 (UUID: GPU-{i:08d}-0000-0000-0000-000000000000)'\n" for i in range(gpus))
    script.write_text(f'#!/bin/sh\n[ "$1" = -L ] || exit 2\n{lines}')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


@pytest.mark.parametrize(
    ("visible", "processes"), [("0,1", 2), ("3", 1), ("GPU-0a1b,GPU-2c3d", 2), ("", 2), ("-1", 2), ("0,-1,1", 1)]
)
def test_one_training_process_per_gpu_cuda_visible_devices_lists(bin_dir, monkeypatch, visible: str, processes: int) -> None:
    _nvidia_smi(bin_dir, 8)  # CUDA_VISIBLE_DEVICES, when set, wins over what the driver lists
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert launch.default_processes() == processes


def test_without_cuda_visible_devices_the_gpus_nvidia_smi_lists(bin_dir) -> None:
    _nvidia_smi(bin_dir, 1)
    assert launch.visible_gpus() == 1 and launch.default_processes() == 1


def test_without_a_gpu_two_processes_on_the_cpu(bin_dir) -> None:
    assert launch.visible_gpus() == 0 and launch.default_processes() == launch.CPU_PROCESSES == 2


def test_train_processes_is_unset_by_default_and_taken_when_set(monkeypatch) -> None:
    monkeypatch.delenv("LOOPLINE_FEEDBACK__TRAIN_PROCESSES", raising=False)
    assert Settings().feedback.train_processes is None
    monkeypatch.setenv("LOOPLINE_FEEDBACK__TRAIN_PROCESSES", "3")
    assert Settings().feedback.train_processes == 3


def test_the_scorers_gpu_detection_honours_an_empty_cuda_visible_devices(bin_dir, monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(onnx_runtime, "DEVICE_DIR", tmp_path)
    assert not onnx_runtime.gpu_visible()
    _nvidia_smi(bin_dir, 1)
    assert onnx_runtime.gpu_visible()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert not onnx_runtime.gpu_visible()


def test_a_device_node_without_nvidia_smi_is_a_gpu_too(bin_dir, monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(onnx_runtime, "DEVICE_DIR", tmp_path)
    (tmp_path / "nvidiactl").touch()  # the driver's control node alone is no device
    assert not onnx_runtime.gpu_visible()
    (tmp_path / "nvidia0").touch()
    assert onnx_runtime.gpu_visible()


def test_the_workers_get_a_deterministic_cublas_workspace(monkeypatch) -> None:
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    assert launch._worker_env()["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # the other value cuBLAS accepts, when the caller chose it
    assert launch._worker_env()["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"  # the launcher's own environment is left alone
