"""The fraud project's synthetic world: a realistic, deterministic transaction stream with planted fraud and late labels.

The stream is infinite and fully determined by the seed, the start time and the config:
any prefix of it is identical across runs. It has

* many users with Zipf-like activity, home countries and typical amounts, and merchants
  with categories and price levels;
* traffic bursts (periods of several times the base rate);
* planted fraud: velocity bursts (a compromised card used many times within a minute at
  unfamiliar online merchants abroad) and amount spikes (10-40x the user's typical amount);
* out-of-order events (event time up to ``max_out_of_order_s`` behind the stream) and late
  events (far behind it), at configurable rates;
* outcome labels for every fraud and a sample of legitimate transactions, emitted later;
* optionally, malformed records (as real producers send) to exercise dead-lettering.

Its knobs beside the common ones (``streams/world.py``): ``users``, ``merchants``, ``velocity_fraud_rate``,
``spike_fraud_rate``, ``legit_label_rate``. Every transaction is scored when it happens (``score_request``);
``requests`` is a load of score requests for the busiest users (the fault drill's and the Kafka door tests').
"""

from __future__ import annotations

import itertools
import json
import random
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

from schemas.project import Project
from schemas.records import ScoreRequest
from schemas.topics import SCORE_REQUESTS
from schemas.validation import encode
from streams.world import Emitted, Later, WorldConfig

TRANSACTIONS, LABELS = "events.transactions", "events.labels"

COUNTRIES = {"US": "USD", "DE": "EUR", "FR": "EUR", "GB": "GBP", "NL": "EUR", "ES": "EUR", "PL": "PLN", "SE": "SEK"}
_COUNTRY_WEIGHTS = (30, 18, 12, 12, 8, 8, 7, 5)
CATEGORIES = {  # category -> (price level, share of merchants)
    "grocery": (1.0, 25),
    "restaurants": (1.2, 20),
    "fuel": (1.6, 10),
    "pharmacy": (0.8, 8),
    "online_retail": (2.0, 15),
    "electronics": (6.0, 7),
    "travel": (9.0, 5),
    "gaming": (1.5, 10),
}
_BURST_FACTOR = 4.0
_BURST_SHARE = 0.1  # share of time spent in a traffic burst
_MEAN_MS_BETWEEN_BURSTS = 6_000 * (1 - _BURST_SHARE) / _BURST_SHARE  # bursts last 6 s on average


@dataclass(frozen=True)
class _Knobs:
    """The fraud world's own knobs (``WorldConfig.knobs``): rates are per transaction."""

    users: int = 5_000
    merchants: int = 500
    velocity_fraud_rate: float = 0.001
    spike_fraud_rate: float = 0.002
    legit_label_rate: float = 0.05


@dataclass(frozen=True)
class _User:
    user_id: str
    country: str
    typical_amount: float
    channel: Literal["online", "pos", "atm"]


@dataclass(frozen=True)
class _Merchant:
    merchant_id: str
    country: str
    category: str


def _cumulative(weights: list[float]) -> list[float]:
    return list(itertools.accumulate(weights))


def synthetic_user_id(rank: int) -> str:
    """The id of the synthetic user of activity rank ``rank`` (0 is the busiest)."""
    return f"u{rank:06d}"


class FraudWorld:
    """Iterate to get the world's records in emission order (``emit_at_ms`` never decreases)."""

    def __init__(self, project: Project, config: WorldConfig, seed: int, start_ms: int) -> None:
        self.config = config
        self.knobs = _Knobs(**config.knobs)
        self.start_ms = start_ms
        self.project = project
        self._transaction_type = project.contract(TRANSACTIONS).record_type
        self._label_type = project.contract(LABELS).record_type
        self._rng = random.Random(seed)
        rng = self._rng
        countries = list(COUNTRIES)
        self._users = [
            _User(
                synthetic_user_id(i),
                rng.choices(countries, weights=_COUNTRY_WEIGHTS)[0],
                round(rng.lognormvariate(3.2, 0.7), 2),
                rng.choices(["pos", "online", "atm"], weights=[60, 35, 5])[0],
            )
            for i in range(self.knobs.users)
        ]
        self._user_cum = _cumulative([1.0 / (rank + 1) ** 0.8 for rank in range(self.knobs.users)])
        categories = list(CATEGORIES)
        self._merchants = [
            _Merchant(
                f"m{i:05d}",
                rng.choices(countries, weights=_COUNTRY_WEIGHTS)[0],
                rng.choices(categories, weights=[share for _, share in CATEGORIES.values()])[0],
            )
            for i in range(self.knobs.merchants)
        ]
        self._merchant_cum = _cumulative([1.0 / (rank + 1) ** 0.6 for rank in range(self.knobs.merchants)])
        # Long-run average rate equals rate_per_s despite bursts.
        self._base_rate = config.rate_per_s / (1 + _BURST_SHARE * (_BURST_FACTOR - 1))
        self._burst_until_ms = -1
        self._later = Later()

    def _uuid(self) -> str:
        return str(uuid.UUID(int=self._rng.getrandbits(128), version=4))

    def _transaction(self, now_ms: int, user: _User, merchant: _Merchant, amount: float, channel: str) -> Emitted:
        event = self._transaction_type(
            schema_version=1,
            event_id=self._uuid(),
            event_time_ms=self.config.event_time(self._rng, now_ms),
            user_id=user.user_id,
            merchant_id=merchant.merchant_id,
            amount=round(amount, 2),
            currency=COUNTRIES[merchant.country],
            merchant_category=merchant.category,
            channel=channel,
            country=merchant.country,
        )
        return Emitted(TRANSACTIONS, user.user_id, self.project.encode(TRANSACTIONS, event), now_ms, event)

    def _label(self, transaction, emitted_ms: int, is_fraud: bool) -> None:
        delay_ms = int(self._rng.uniform(*self.config.label_delay_s) * 1000)
        label = self._label_type(
            schema_version=1,
            event_id=transaction.event_id,
            user_id=transaction.user_id,
            is_fraud=is_fraud,
            label_time_ms=emitted_ms + delay_ms,
            source=self._rng.choice(["chargeback", "customer_report"]) if is_fraud else "manual_review",
        )
        self._later.add(Emitted(LABELS, transaction.event_id, self.project.encode(LABELS, label), emitted_ms + delay_ms, label))

    def _malformed(self, now_ms: int, user: _User) -> Emitted:
        """A broken payload of one of the kinds real producers send."""
        good = {
            "schema_version": 1,
            "event_id": self._uuid(),
            "event_time_ms": now_ms,
            "user_id": user.user_id,
            "merchant_id": "m00000",
            "amount": 10.0,
            "currency": "EUR",
            "merchant_category": "grocery",
            "channel": "pos",
            "country": "DE",
        }
        kind = self._rng.randrange(5)
        if kind == 0:
            value = json.dumps(good)[:-7].encode()  # truncated
        else:
            broken = dict(good)
            if kind == 1:
                broken["amount"] = "12,50"
            elif kind == 2:
                del broken["user_id"]
            elif kind == 3:
                broken["schema_version"] = 99
            else:
                broken["amount"] = -5.0
            value = json.dumps(broken).encode()
        return Emitted(TRANSACTIONS, user.user_id, value, now_ms, None)

    def _velocity_burst(self, now_ms: int, user: _User) -> None:
        """A compromised card: several quick online purchases abroad, all fraud."""
        at = now_ms
        foreign = [m for m in self._merchants[:200] if m.country != user.country] or self._merchants
        for _ in range(self._rng.randint(5, 12)):
            at += int(self._rng.uniform(2.0, 12.0) * 1000)
            merchant = self._rng.choice(foreign)
            amount = user.typical_amount * self._rng.uniform(1.5, 5.0)
            emitted = self._transaction(at, user, merchant, amount, "online")
            self._later.add(emitted)
            self._label(emitted.record, at, is_fraud=True)

    def _organic(self, now_ms: int) -> Emitted:
        rng, config, knobs = self._rng, self.config, self.knobs
        user = self._users[rng.choices(range(knobs.users), cum_weights=self._user_cum)[0]]
        if rng.random() < config.malformed_rate:
            return self._malformed(now_ms, user)
        merchant = self._merchants[rng.choices(range(knobs.merchants), cum_weights=self._merchant_cum)[0]]
        price_level = CATEGORIES[merchant.category][0]
        amount = user.typical_amount * price_level * rng.lognormvariate(0.0, 0.5)
        is_spike = rng.random() < knobs.spike_fraud_rate
        if is_spike:
            amount *= rng.uniform(10.0, 40.0)
        channel = user.channel if rng.random() < 0.8 else rng.choice(["pos", "online"])
        emitted = self._transaction(now_ms, user, merchant, amount, channel)
        if is_spike:
            self._label(emitted.record, now_ms, is_fraud=True)
        elif rng.random() < knobs.legit_label_rate:
            self._label(emitted.record, now_ms, is_fraud=False)
        if rng.random() < knobs.velocity_fraud_rate:
            self._velocity_burst(now_ms, user)
        return emitted

    def _next_arrival(self, now_ms: float) -> float:
        """Poisson arrivals; bursts start as a Poisson process in time and last 2-10 s."""
        rng = self._rng
        in_burst = now_ms < self._burst_until_ms
        next_ms = now_ms + rng.expovariate(self._base_rate * (_BURST_FACTOR if in_burst else 1.0) / 1000.0)
        if not in_burst and rng.random() < (next_ms - now_ms) / _MEAN_MS_BETWEEN_BURSTS:
            self._burst_until_ms = int(next_ms + rng.uniform(2_000, 10_000))
        return next_ms

    def __iter__(self) -> Iterator[Emitted]:
        clock = float(self.start_ms)
        while True:
            clock = self._next_arrival(clock)
            now_ms = int(clock)
            yield from self._later.due(now_ms)
            yield self._organic(now_ms)

    def score_request(self, emitted: Emitted, request_id: str, skew: Mapping[str, float]) -> ScoreRequest | None:
        """The score request a transaction gets as it happens: its user, the amount (times ``skew``'s factor for it),
        naming the transaction, stamped now; None for a label or a broken record."""
        if emitted.topic != TRANSACTIONS or emitted.record is None:
            return None
        transaction = emitted.record
        return ScoreRequest(
            schema_version=ScoreRequest.SCHEMA_VERSION,
            request_id=request_id,
            event_id=transaction.event_id,
            entity_keys={"user_id": transaction.user_id},
            request_fields={"amount": transaction.amount * skew.get("amount", 1.0)},
            requested_at_ms=int(time.time() * 1000),
        )

    def requests(self, rate_per_s: float, run_id: str, event_ids: bool = False) -> Iterator[Emitted]:
        """Score requests ``<run_id>-<n>`` for the world's users (the busiest asked about most, Zipf-like), paced at
        ``rate_per_s``; each is stamped as it is drawn, i.e. as the producer sends it. With ``event_ids`` each scores
        the event of its own id (so a label of that id joins its prediction)."""
        rng = random.Random(run_id)
        user_ids = [user.user_id for user in self._users]
        emit_at_ms = time.time() * 1000
        for n in itertools.count():
            emit_at_ms += rng.expovariate(rate_per_s / 1000)
            user = rng.choices(user_ids, cum_weights=self._user_cum)[0]
            request = ScoreRequest(
                schema_version=ScoreRequest.SCHEMA_VERSION,
                request_id=f"{run_id}-{n}",
                entity_keys={"user_id": user},
                request_fields={"amount": round(rng.lognormvariate(3.2, 0.9), 2)},
                requested_at_ms=int(time.time() * 1000),
                event_id=f"{run_id}-{n}" if event_ids else None,
            )
            yield Emitted(SCORE_REQUESTS.name, request.request_id, encode(request), int(emit_at_ms), request)

    def label(self, event_id: str, n: int) -> Emitted:
        """A label of the scored event ``event_id``, published now: every seventh (by ``n``) a chargeback."""
        now = int(time.time() * 1000)
        label = self._label_type(
            schema_version=1,
            event_id=event_id,
            user_id="drill",
            is_fraud=n % 7 == 0,
            label_time_ms=now,
            source="chargeback" if n % 7 == 0 else "manual_review",
        )
        return Emitted(LABELS, event_id, self.project.encode(LABELS, label), now, label)
