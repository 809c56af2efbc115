"""Watch a restarted single-node broker for hanging transactions and abort them (``KafkaBroker.start`` runs it).

``python -m infra.kafka_janitor HOST:PORT JARS_DIR [SECONDS]``: every 15 s for SECONDS (default 150), find
transactions the crash left hanging (``KafkaBroker.hanging_transactions``: open for over a minute, their
coordinator done with them) and abort each, printing one line per abort (to the broker's log). It stops
early when the broker does.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from infra.errors import StackError
from infra.kafka import KafkaBroker
from infra.service import port_in_use

_POLL_S = 15.0


def main(address: str, jars_dir: str, seconds: str = "150") -> None:
    host, port = address.rsplit(":", 1)
    scratch = Path(tempfile.mkdtemp(prefix="loopline-janitor-"))
    broker = KafkaBroker(host, int(port), 0, scratch, Path(jars_dir), scratch, scratch)
    deadline = time.monotonic() + float(seconds)
    while time.monotonic() < deadline:
        time.sleep(_POLL_S)
        if not port_in_use(host, int(port)):  # the broker stopped: nothing left to watch
            return
        try:
            for topic, partition, start_offset in broker.hanging_transactions():
                broker.abort_transaction(topic, partition, start_offset)
                print(f"loopline-janitor: aborted the hanging transaction on {topic}-{partition} from offset {start_offset}", flush=True)
        except StackError as err:  # the broker is busy or gone: look again at the next round
            print(f"loopline-janitor: {err}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
