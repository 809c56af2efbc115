"""Two logistic regressions over the fraud view's features, versions ``a`` and ``b`` of one model, and the score
each gives a user whose features all take their defaults: a response names its version, and its score proves it."""

from __future__ import annotations

import numpy as np

VIEW = "user_transaction_features"
INPUTS = [f"{VIEW}:txn_count_5m", f"{VIEW}:amount_sum_1h", f"{VIEW}:secs_since_prev_txn", "request:amount"]
#: An unknown user: every feature takes its declared default, so only the amount and the weights vary.
USER = "swap-nobody"
DEFAULT_ROW = [0.0, 0.0, -1.0]
WEIGHTS = {"a": (np.array([0.3, 0.002, -0.01, 0.004]), -2.0), "b": (np.array([0.1, 0.001, 0.02, -0.003]), 0.5)}


def expected_score(kind: str, amount: float) -> float:
    weights, bias = WEIGHTS[kind]
    z = np.dot(np.array(DEFAULT_ROW + [amount], dtype=np.float32), weights.astype(np.float32)) + np.float32(bias)
    return float(1 / (1 + np.exp(-z)))
