"""How the nodes of one training run find each other: torchrun's rendezvous, for one node or many.

One machine is the one-node case of the same thing: ``--standalone`` is torchrun's c10d rendezvous on a free
local port. Across nodes every node runs the same command with its own ``node_rank``; they meet at ``rdzv``
(``HOST:PORT``), a c10d store that node 0 serves, so node 0 must run on ``HOST``. The rendezvous, not
``node_rank``, numbers the workers; a worker's rank does not change what it computes (its data shard follows its
rank, whichever node holds it), so N nodes of P processes train the weights one node of N×P processes trains.

With ``max_restarts``, torchrun restarts every node's workers when one of them fails or a node leaves and
another joins (it counts both); restarted workers continue from the newest checkpoint (``offline_training.train``).
"""

from __future__ import annotations

from dataclasses import dataclass

from offline_training.errors import OfflineTrainingError

#: The rendezvous' name for the run. Each run's rendezvous is its own (node 0 serves it), so one name serves them all.
RUN_ID = "loopline-training"


class NodeGroupError(OfflineTrainingError, ValueError):
    """The nodes of a run are described wrongly (the message says how to describe them)."""


@dataclass(frozen=True, kw_only=True)
class NodeGroup:
    """The nodes of one training run as this node sees them: how many, which one this is, where they meet."""

    nnodes: int = 1
    node_rank: int = 0
    #: ``HOST:PORT`` of the rendezvous node 0 serves; None on one node (torchrun picks a free local port).
    rdzv: str | None = None
    #: How many times torchrun restarts the workers (a failed process, a node that left and joined again).
    max_restarts: int = 0

    def __post_init__(self) -> None:
        if self.nnodes < 1 or not 0 <= self.node_rank < self.nnodes:
            raise NodeGroupError(f"node rank {self.node_rank} of {self.nnodes} nodes: give --nnodes N ≥ 1 and --node-rank 0..N-1")
        if self.max_restarts < 0:
            raise NodeGroupError(f"max_restarts is {self.max_restarts}: give 0 (no restarts) or more")
        if self.rdzv is None:
            if self.nnodes > 1:
                raise NodeGroupError(
                    f"{self.nnodes} nodes need a place to meet: add --rdzv HOST:PORT, node 0's address and a free port"
                )
            return
        host, _, port = self.rdzv.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise NodeGroupError(
                f"--rdzv {self.rdzv!r} is not HOST:PORT: give node 0's address and a free port, e.g. node0:29400"
            )

    def torchrun_arguments(self, processes: int) -> list[str]:
        """torchrun's arguments (before the training module) for ``processes`` workers on this node."""
        if self.rdzv is None:
            meeting = ["--standalone"]
        else:
            # Node 0 serves the c10d store. Left to itself, torchrun lets any node whose address is HOST serve it, the
            # first to start: with several nodes on one host (the tests), not necessarily node 0.
            meeting = [
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint={self.rdzv}",
                f"--rdzv-id={RUN_ID}",
                f"--rdzv-conf=is_host={str(self.node_rank == 0).lower()}",
            ]
        return [*meeting, f"--nnodes={self.nnodes}", f"--nproc-per-node={processes}", f"--max-restarts={self.max_restarts}"]


#: A run on this machine alone.
ONE_NODE = NodeGroup()
