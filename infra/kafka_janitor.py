"""Watch a restarted single-node broker for hanging transactions and abort them (``KafkaBroker.start`` runs it).

``python -m infra.kafka_janitor HOST:PORT JARS_DIR [SECONDS]``: for SECONDS (default 180), every 10 s from the
45th on, find transactions the crash left hanging (``KafkaBroker.hanging_transactions``: open for over a minute,
their coordinator done with them) and abort each, printing one line per abort (to the broker's log). Nothing
written before the crash can be a minute old sooner, so it does not look sooner. It stops early when the broker
does.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from infra.errors import StackError
from infra.kafka import KafkaBroker
from infra.service import port_in_use

_FIRST_LOOK_S, _POLL_S = 45.0, 10.0
#: How each abort's line in the broker's log begins (the fault drill counts them).
ABORTED = "loopline-janitor: aborted"


def main(address: str, jars_dir: str, seconds: str = "180") -> None:
    host, port = address.rsplit(":", 1)
    scratch = Path(tempfile.mkdtemp(prefix="loopline-janitor-"))
    broker = KafkaBroker(host, int(port), 0, scratch, Path(jars_dir), scratch, scratch)
    began = time.monotonic()
    time.sleep(_FIRST_LOOK_S)
    while time.monotonic() < began + float(seconds):
        if not port_in_use(host, int(port)):  # the broker stopped: nothing left to watch
            return
        try:
            hanging = broker.hanging_transactions()
        except StackError as err:  # the broker is busy or gone: look again at the next round
            print(f"loopline-janitor: {err}", flush=True)
            hanging = []
        for topic, partition, start_offset in hanging:
            # One abort may fail where another's markers already closed the transaction (the group's offsets
            # aborted, its scorer commits again): the others are still tried, and the next round looks again.
            try:
                broker.abort_transaction(topic, partition, start_offset)
                print(f"{ABORTED} the hanging transaction on {topic}-{partition} from offset {start_offset}", flush=True)
            except StackError as err:
                print(f"loopline-janitor: {err}", flush=True)
        time.sleep(_POLL_S)


if __name__ == "__main__":
    main(*sys.argv[1:])
