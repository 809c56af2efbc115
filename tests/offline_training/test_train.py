"""Training for real: DeepSpeed on the CPU (gloo, 2 processes through torchrun) on a small synthetic snapshot.

Kill-and-resume equals an uninterrupted run bit for bit; a universal checkpoint written by 2 processes
resumes on 1; two launchers on this machine, each its own node of 1 process (torchrun's c10d
rendezvous, one shared output folder), train the weights of one launcher with 2 processes, and do so
still when one node is killed mid-run and rejoins; so do two nodes of a DeepSpeed hostfile; the ONNX export scores as torch does
and loads in the scorer's runtime; the holdout finds the planted signal. The first DeepSpeed initialize on a machine JIT-compiles
a CPU comm op (about a minute, then cached under ~/.cache/torch_extensions): the first run here pays it once.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from infra.service import free_port, wait_until

#: The integration tier: DeepSpeed runs under torchrun, minutes on 2 cores.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        find_spec("torch") is None or find_spec("deepspeed") is None,
        reason="needs torch and deepspeed: pip install -e '.[train]' (make setup installs the train extra)",
    ),
]

FEATURES = [
    "user_transaction_features:txn_count_5m",
    "user_transaction_features:txn_amount_sum_1h",
    "user_transaction_features:distinct_merchants_1d",
    "request:amount",
    "request:hour",
    "request:is_new_device",
]
ROWS, HOLDOUT_FRACTION = 3000, 0.2
# 2 processes x 32 rows make 36 optimizer steps an epoch, 108 in all: the stopped run dies at step 50,
# 10 steps after its newest checkpoint (step 40, mid-epoch 2), so resuming replays steps 41-50.
CONFIG = {
    "hidden": [16, 8],
    "learning_rate": 0.01,
    "weight_decay": 0.0001,
    "epochs": 3,
    "micro_batch_per_process": 32,
    "seed": 3,
    "holdout_fraction": HOLDOUT_FRACTION,
    "checkpoint_every_steps": 20,
    "keep_last": 2,
    "ds_config": "infra/deepspeed/zero2.json",
}
STOP_AFTER, LAST_CHECKPOINT_BEFORE_STOP, TOTAL_STEPS = 50, 40, 108


def write_snapshot(folder: Path, rows: int = ROWS, seed: int = 0) -> Path:
    """A snapshot as feedback_loop/snapshots.py lays it out, with fraud driven by three of its inputs.

    Raw scales differ by orders of magnitude (counts, amounts in the thousands), a few values are
    missing, 5 % of rows are unlabelled, and the files list rows out of time order.
    """
    rng = np.random.default_rng(seed)
    count = rng.poisson(3, rows).astype(float)
    amount = rng.lognormal(4, 1.2, rows)
    new_device = rng.integers(0, 2, rows).astype(float)
    logit = 1.2 * (count - 3) + 2.0 * new_device + 1.8 * (np.log(amount) - 4) - 1.5
    label = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(float)
    label[rng.random(rows) < 0.05] = np.nan
    frame = pd.DataFrame(
        {
            "event_id": [f"evt-{i:05d}" for i in range(rows)],
            "label": label,
            "predicted_at_ms": 1_790_000_000_000 + np.arange(rows, dtype=np.int64) * 1000,
            FEATURES[0]: count,
            FEATURES[1]: np.where(rng.random(rows) < 0.03, np.nan, rng.gamma(2, 400, rows)),
            FEATURES[2]: rng.integers(1, 12, rows).astype(float),
            FEATURES[3]: amount,
            FEATURES[4]: rng.integers(0, 24, rows).astype(float),
            FEATURES[5]: new_device,
        }
    )
    shuffled = frame.sample(frac=1.0, random_state=seed)
    for part, chunk in enumerate((shuffled.iloc[: rows // 2], shuffled.iloc[rows // 2 :])):
        path = folder / "data" / f"day=2026-11-{29 + part}" / f"part-{part}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        chunk.to_parquet(path, index=False)
    manifest = {"snapshot_id": "snap-test-0001", "features": FEATURES, "rows": rows}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("training")
    write_snapshot(root / "snapshot")
    (root / "config.yaml").write_text(json.dumps(CONFIG))  # JSON is YAML
    return root


@pytest.fixture(scope="module")
def full_run(workspace) -> Path:
    """An uninterrupted 2-process run, tracked in MLflow."""
    from offline_training.launch import launch_training

    out = workspace / "full"
    launch_training(workspace / "snapshot", workspace / "config.yaml", out, tracking_uri=f"sqlite:///{workspace}/mlflow.db")
    return out


@pytest.fixture(scope="module")
def stopped_run(workspace) -> Path:
    """The same run, dying (os._exit, like a kill) after global step 50."""
    from offline_training.launch import TrainingError, launch_training

    out = workspace / "stopped"
    with pytest.raises(TrainingError):
        launch_training(workspace / "snapshot", workspace / "config.yaml", out, extra=["--stop-after-steps", str(STOP_AFTER)])
    return out


def _weights(out: Path) -> dict:
    import torch

    return torch.load(out / "model.pt", weights_only=True)


@pytest.fixture(scope="module")
def killed_run(workspace) -> Path:
    """The same run, its launcher and both workers killed with SIGKILL at a (seeded) random moment after its first
    checkpoint: mid-step, mid-checkpoint or between them."""
    import psutil

    from offline_training.launch import CHECKPOINTS, TrainingError, launch_training

    out = workspace / "killed"
    failures: list[BaseException] = []

    def run() -> None:
        try:
            launch_training(workspace / "snapshot", workspace / "config.yaml", out)
        except TrainingError as err:
            failures.append(err)

    runner = threading.Thread(target=run)
    runner.start()
    assert wait_until(lambda: (out / CHECKPOINTS / "latest").exists() or not runner.is_alive(), 120, 0.01)
    time.sleep(random.Random(7).uniform(0.0, 1.0))  # the kill's moment, not a wait for a condition
    for process in psutil.process_iter(["cmdline"]):
        if str(out) in " ".join(process.info["cmdline"] or []):
            process.send_signal(signal.SIGKILL)
    runner.join(60)
    assert failures and not (out / "model.pt").exists(), "the run finished before the kill"
    return out


def test_zero_stage_3_trains_the_weights_of_stage_2(workspace, full_run):
    """ZeRO 3 (``infra/deepspeed/zero3.json``) keeps each rank's partition of the parameters only: the epoch-end holdout
    and the written model gather them, a collective every rank enters (rank 0 alone would wait for the others on
    GPUs)."""
    from offline_training.launch import launch_training

    config = workspace / "zero3.yaml"
    config.write_text(json.dumps({**CONFIG, "ds_config": "infra/deepspeed/zero3.json"}))
    out = workspace / "zero3"
    launch_training(workspace / "snapshot", config, out)
    expected, stage3 = _weights(full_run), _weights(out)
    assert expected.keys() == stage3.keys()
    for name in expected:  # the same data, seed, world size and reductions (gloo): bit for bit
        assert np.array_equal(stage3[name].numpy(), expected[name].numpy()), name
    assert json.loads((out / "metrics.json").read_text())["onnx_max_abs_diff"] <= 1e-5


def test_killed_and_resumed_run_ends_with_the_uninterrupted_weights(workspace, full_run, killed_run):
    from offline_training.launch import latest_tag, launch_training

    tag = latest_tag(killed_run / "checkpoints")
    done = launch_training(workspace / "snapshot", workspace / "config.yaml", killed_run, resume=True)

    assert f"resumed from checkpoint {tag} " in done.stdout
    expected, resumed = _weights(full_run), _weights(killed_run)
    assert expected.keys() == resumed.keys()
    for name in expected:
        assert np.array_equal(expected[name].numpy(), resumed[name].numpy()), name
    # Checkpoints every 20 steps and at each epoch's end, only the last 2 kept.
    assert sorted(p.name for p in (killed_run / "checkpoints").iterdir() if p.is_dir()) == ["step100", f"step{TOTAL_STEPS}"]
    assert json.loads((killed_run / "metrics.json").read_text())["global_steps"] == TOTAL_STEPS


def test_universal_checkpoint_resumes_on_another_world_size(workspace, stopped_run):
    import torch

    from offline_training.launch import latest_tag, launch_training
    from offline_training.model import state_fingerprint

    out = workspace / "universal"
    shutil.copytree(stopped_run, out)
    tag = latest_tag(out / "checkpoints")
    saved = torch.load(out / "checkpoints" / tag / "mp_rank_00_model_states.pt", weights_only=False)

    done = launch_training(workspace / "snapshot", workspace / "config.yaml", out, processes=1, resume=True)

    assert latest_tag(out / "checkpoints", universal=True) == f"{tag}_universal"
    resumed = re.search(r"resumed from checkpoint (\S+) \(written by 2 processes\).*weights sha256 ([0-9a-f]{64})", done.stdout)
    assert resumed, done.stdout[-3000:]
    assert resumed.group(1) == f"{tag}_universal"
    assert resumed.group(2) == state_fingerprint(saved["module"])
    metrics = json.loads((out / "metrics.json").read_text())
    # One process takes 32-row steps: the rest of epoch 2 (64 steps after its first 8) and epoch 3 (72 steps).
    assert metrics["world_size"] == 1
    assert metrics["global_steps"] == LAST_CHECKPOINT_BEFORE_STOP + 64 + 72
    assert metrics["holdout"]["auc"] > 0.8


class Node(threading.Thread):
    """One training node of 1 process: ``launch_training`` on a thread of its own, as if on its own machine."""

    def __init__(self, workspace: Path, out: Path, nodes, resume: bool = False) -> None:
        super().__init__()
        self.workspace, self.out, self.nodes, self.resume = workspace, out, nodes, resume
        self.launcher: subprocess.Popen | None = None
        self.result: subprocess.CompletedProcess | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        from offline_training.launch import launch_training

        try:
            # The snapshot as a URL, as every node of a cluster reads it (here file://; s3:// and the like at scale).
            self.result = launch_training(
                (self.workspace / "snapshot").as_uri(),
                self.workspace / "config.yaml",
                self.out,
                processes=1,
                resume=self.resume,
                nodes=self.nodes,
                on_start=lambda process: setattr(self, "launcher", process),
            )
        except Exception as err:  # a node that fails is what a test may expect: it reads this
            self.error = err

    def kill(self) -> None:
        """The node dies: its launcher and its worker, SIGKILL."""
        from offline_training.launch import stop_training

        stop_training(self.launcher)


def _two_nodes(workspace: Path, out: Path, max_restarts: int = 0) -> list[Node]:
    """Nodes 0 and 1 of a run meeting at a free port on this machine, started."""
    from offline_training.rendezvous import NodeGroup

    rdzv = f"127.0.0.1:{free_port()}"
    nodes = [Node(workspace, out, NodeGroup(nnodes=2, node_rank=rank, rdzv=rdzv, max_restarts=max_restarts)) for rank in (0, 1)]
    for node in nodes:
        node.start()
    return nodes


def _assert_same_weights(expected_run: Path, run: Path) -> None:
    expected, trained = _weights(expected_run), _weights(run)
    assert expected.keys() == trained.keys()
    for name in expected:
        assert np.array_equal(expected[name].numpy(), trained[name].numpy()), name


def test_two_nodes_train_the_weights_of_one_node_with_two_processes(workspace, full_run):
    from offline_training.launch import checkpoint_world_size

    out = workspace / "two-nodes"
    nodes = _two_nodes(workspace, out)
    for node in nodes:
        node.join(240)
    assert [node.error for node in nodes] == [None, None], nodes[0].error or nodes[1].error

    _assert_same_weights(full_run, out)
    metrics = json.loads((out / "metrics.json").read_text())
    assert (metrics["world_size"], metrics["global_steps"]) == (2, TOTAL_STEPS)
    assert checkpoint_world_size(out / "checkpoints") == 2  # one ZeRO shard from each node, in the one shared folder
    assert (out / "train.log").stat().st_size and (out / "train.node1.log").stat().st_size


def test_a_killed_node_rejoins_and_the_run_resumes_from_its_last_checkpoint(workspace, full_run):
    from offline_training.launch import CHECKPOINTS, latest_tag
    from offline_training.rendezvous import NodeGroup

    out = workspace / "node-killed"
    survivor, lost = _two_nodes(workspace, out, max_restarts=1)
    assert wait_until(lambda: (out / CHECKPOINTS / "latest").exists() or not survivor.is_alive(), 120, 0.01)
    lost.kill()
    killed = time.monotonic()
    lost.join(60)
    tag = latest_tag(out / CHECKPOINTS)
    assert isinstance(lost.error, Exception) and not (out / "model.pt").exists(), "the run finished before the kill"

    # The node comes back (or a replacement, at the same rendezvous); node 0's launcher never stopped.
    rejoined = Node(workspace, out, NodeGroup(nnodes=2, node_rank=1, rdzv=lost.nodes.rdzv, max_restarts=1), resume=True)
    rejoined.start()
    logs = [out / "train.log", out / "train.node1.log"]  # rank 0, which says where it resumed, is on either node
    assert wait_until(lambda: any("resumed from checkpoint" in log.read_text() for log in logs), 180, 0.1)
    resumed_after_s = time.monotonic() - killed
    for node in (survivor, rejoined):
        node.join(240)
    assert [survivor.error, rejoined.error] == [None, None], survivor.error or rejoined.error

    # The survivor's launcher, running since before the kill, finished: torchrun restarted its worker (--max-restarts),
    # which resumed by itself, as the rejoined node's did with --resume, from the checkpoint newest at the kill.
    assert f"resumed from checkpoint {tag} (written by 2 processes)" in survivor.result.stdout + rejoined.result.stdout
    _assert_same_weights(full_run, out)
    assert json.loads((out / "metrics.json").read_text())["global_steps"] == TOTAL_STEPS
    print(
        f"node 1 killed after checkpoint {tag}; the run resumed from it {resumed_after_s:.1f} s later (node 1 relaunched "
        f"at once) and finished {time.monotonic() - killed:.1f} s after the kill"
    )


def test_two_nodes_of_a_deepspeed_hostfile_train_the_same_weights(workspace, full_run, tmp_path):
    """The hostfile command of the scale-out guide (docs/guides/scale-out.md), each node started by hand (``--no_ssh``:
    there is no ssh between nodes here)."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node0 slots=1\nnode1 slots=1\n")
    out, port = workspace / "hostfile-nodes", free_port()
    # What launch_training gives its workers on a machine without CUDA.
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    nodes = [
        subprocess.Popen(
            [
                str(Path(sys.executable).with_name("deepspeed")),
                "--hostfile",
                str(hostfile),
                "--no_ssh",
                "--node_rank",
                str(rank),
                "--master_addr",
                "127.0.0.1",
                "--master_port",
                str(port),
                "--no_local_rank",
                "--module",
                "offline_training.train",
                "--snapshot",
                str(workspace / "snapshot"),
                "--config",
                str(workspace / "config.yaml"),
                "--out",
                str(out),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [node.communicate(timeout=240)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(output[-3000:] for output in outputs)
    _assert_same_weights(full_run, out)


def test_node_groups_are_described_or_refused():
    from pydantic import ValidationError

    from loopline.settings import Settings
    from offline_training.rendezvous import ONE_NODE, NodeGroup, NodeGroupError

    assert ONE_NODE.torchrun_arguments(2) == ["--standalone", "--nnodes=1", "--nproc-per-node=2", "--max-restarts=0"]
    node1 = NodeGroup(nnodes=3, node_rank=1, rdzv="node0:29400", max_restarts=2).torchrun_arguments(4)
    assert "--rdzv-endpoint=node0:29400" in node1 and "--rdzv-conf=is_host=false" in node1 and "--nnodes=3" in node1
    for wrong, fix in [
        ({"nnodes": 2}, "--rdzv HOST:PORT"),
        ({"nnodes": 2, "node_rank": 2, "rdzv": "h:1"}, "--node-rank 0..N-1"),
        ({"nnodes": 2, "rdzv": "node0"}, "is not HOST:PORT"),
    ]:
        with pytest.raises(NodeGroupError, match=re.escape(fix)):
            NodeGroup(**wrong)
    with pytest.raises(ValidationError, match="give the mount's path"):
        Settings(feedback={"train_dir": "s3://bucket/training"})


def test_onnx_export_scores_as_torch_and_loads_in_the_scorer(workspace, full_run):
    import torch

    from offline_training.export import verify_onnx
    from offline_training.model import TabularMLP
    from offline_training.training_data import load_snapshot
    from online.onnx_runtime import OnnxModel

    snapshot = load_snapshot(workspace / "snapshot", HOLDOUT_FRACTION)
    model = TabularMLP(snapshot.inputs, CONFIG["hidden"], np.zeros(len(FEATURES)), np.ones(len(FEATURES)))
    model.load_state_dict(_weights(full_run))
    frame = snapshot.holdout.copy()
    frame.iloc[::7, 1] = np.nan  # missing inputs take the same path in both

    assert verify_onnx(model, full_run / "model.onnx", frame, atol=1e-5) <= 1e-5
    served = OnnxModel(full_run / "model.onnx", "fraud", "1")
    assert [spec.name for spec in served.inputs] == FEATURES
    rows = frame[FEATURES].to_numpy(dtype=np.float32)
    with torch.no_grad():
        expected = model.predict(torch.from_numpy(rows)).numpy()
    no_texts = np.zeros((len(rows), 0), dtype=object)
    for size in (1, 37, len(rows)):
        np.testing.assert_allclose(served.predict(rows[:size], no_texts[:size]), expected[:size], atol=1e-5, rtol=0)
    assert json.loads((full_run / "metrics.json").read_text())["onnx_max_abs_diff"] <= 1e-5


def test_holdout_finds_the_planted_signal_and_the_run_is_tracked(workspace, full_run):
    from mlflow import MlflowClient

    metrics = json.loads((full_run / "metrics.json").read_text())
    assert metrics["holdout"]["auc"] > 0.8
    assert metrics["rows"]["train"] + metrics["rows"]["holdout"] < ROWS  # unlabelled rows skipped
    assert metrics["samples_per_second"] > 0

    client = MlflowClient(tracking_uri=f"sqlite:///{workspace}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("loopline-training").experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.tags["loopline.snapshot_id"] == "snap-test-0001"
    assert run.data.tags["loopline.code_version"]
    assert run.data.params["epochs"] == "3"
    auc_by_epoch = client.get_metric_history(run.info.run_id, "holdout_auc")
    assert [m.step for m in auc_by_epoch] == [1, 2, 3]


def test_config_files_are_valid():
    from offline_training.train_config import LOOPLINE_ROOT, TrainConfig, deepspeed_config, load_train_config

    config = load_train_config(LOOPLINE_ROOT / "offline_training" / "configs" / "mlp.yaml")
    ds_config = deepspeed_config(config)
    assert ds_config["train_micro_batch_size_per_gpu"] == config.micro_batch_per_process
    assert ds_config["zero_optimization"]["stage"] == 1
    zero2 = deepspeed_config(TrainConfig(ds_config=Path("infra/deepspeed/zero2.json")))
    assert zero2["zero_optimization"]["stage"] == 2 and not zero2["bf16"]["enabled"]


def test_bf16_weights_score_bf16_rows_with_the_fp32_standardisation():
    """DeepSpeed's bf16 casts a module's parameters, not its buffers: the model must still score bf16 rows (the GPU
    check's bf16 runs; found rehearsing them on this CPU, where they first raised a dtype mismatch)."""
    import torch

    from offline_training.model import TabularMLP
    from schemas.model_contract import ModelInput

    rows = torch.from_numpy(np.random.default_rng(0).normal(100, 30, (16, len(FEATURES))).astype(np.float32))
    inputs = [ModelInput(name) for name in FEATURES]
    model = TabularMLP(inputs, CONFIG["hidden"], np.full(len(FEATURES), 100.0), np.full(len(FEATURES), 30.0))
    expected = model(rows)
    for parameter in model.parameters():
        parameter.data = parameter.data.to(torch.bfloat16)
    assert model.mean.dtype == torch.float32
    scored = model(rows.to(torch.bfloat16))
    assert scored.dtype == torch.bfloat16
    assert torch.allclose(scored.float(), expected, atol=0.1)
