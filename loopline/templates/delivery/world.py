"""The delivery project's synthetic world: restaurants in zones, couriers moving between them, orders and deliveries.

Deterministic for a seed, a start time and a config (any prefix is identical across runs). It has

* a city of ``zones`` zones on a grid; restaurants (Zipf-like popularity) each in a zone with a cuisine and a
  kitchen's pace; couriers each in a zone, pinging their position (Avro) every few seconds and now and then moving
  to a neighbouring zone;
* orders (JSON) from a restaurant into its own zone or a neighbour, with a courier assigned;
* a delivery for nearly every order, later (``label_delay_s``), whose minutes depend on what the features can see:
  the kitchen's pace and its load over the last fifteen minutes, the order's size and cuisine, how far the courier
  and the customer are from the restaurant, the courier's speed; and on noise they cannot see;
* out-of-order and late events on both topics, and malformed ones of the kinds real producers send, at the
  configured rates.

Its knobs beside the common ones (``streams/world.py``): ``restaurants``, ``couriers``, ``zones``, ``ping_share``
(the share of events that are location pings), ``cancel_rate`` (orders never delivered, so never labelled).
"""

from __future__ import annotations

import itertools
import json
import math
import random
import time
import uuid
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from schemas.project import Project
from schemas.records import ScoreRequest
from schemas.topics import SCORE_REQUESTS
from schemas.validation import encode
from streams.world import Emitted, Later, WorldConfig

ORDERS, LOCATIONS, DELIVERIES = "events.orders", "events.courier_locations", "events.deliveries"

CUISINES = {"pizza": (11.0, 2.0), "burger": (9.0, 0.0), "sushi": (16.0, 3.0), "curry": (12.0, 1.5), "salad": (10.0, -1.0)}
"""cuisine -> (price of an item, minutes it adds to a delivery)"""

_KITCHEN_WINDOW_MS = 15 * 60_000


@dataclass(frozen=True)
class _Knobs:
    """The delivery world's own knobs (``WorldConfig.knobs``)."""

    restaurants: int = 300
    couriers: int = 200
    zones: int = 12
    ping_share: float = 0.5
    cancel_rate: float = 0.02


@dataclass(frozen=True)
class _Restaurant:
    restaurant_id: str
    zone: int
    cuisine: str
    prep_minutes: float


@dataclass
class _Courier:
    courier_id: str
    zone: int
    pace_kmh: float


def synthetic_restaurant_id(rank: int) -> str:
    """The id of the synthetic restaurant of popularity rank ``rank`` (0 is the busiest)."""
    return f"r{rank:04d}"


def zone_name(zone: int) -> str:
    """A zone's name as events carry it (the contracts' pattern z[0-9]{2})."""
    return f"z{zone:02d}"


class DeliveryWorld:
    """Iterate to get the world's records in emission order (``emit_at_ms`` never decreases)."""

    def __init__(self, project: Project, config: WorldConfig, seed: int, start_ms: int) -> None:
        self.config = config
        self.knobs = _Knobs(**config.knobs)
        self.start_ms = start_ms
        self.project = project
        self._order_type = project.contract(ORDERS).record_type
        self._location_type = project.contract(LOCATIONS).record_type
        self._delivery_type = project.contract(DELIVERIES).record_type
        self._rng = rng = random.Random(seed)
        knobs = self.knobs
        self._columns = max(1, round(math.sqrt(knobs.zones)))
        cuisines = list(CUISINES)
        self._restaurants = [
            _Restaurant(synthetic_restaurant_id(i), rng.randrange(knobs.zones), rng.choice(cuisines), rng.uniform(6.0, 22.0))
            for i in range(knobs.restaurants)
        ]
        self._restaurant_cum = list(itertools.accumulate(1.0 / (rank + 1) ** 0.7 for rank in range(knobs.restaurants)))
        self._couriers = [
            _Courier(f"c{i:04d}", rng.randrange(knobs.zones), rng.lognormvariate(math.log(18.0), 0.25))
            for i in range(knobs.couriers)
        ]
        self._kitchen: dict[str, deque[int]] = {}
        self._later = Later()

    def _uuid(self) -> str:
        return str(uuid.UUID(int=self._rng.getrandbits(128), version=4))

    def _distance(self, a: int, b: int) -> int:
        """Blocks between two zones of the grid."""
        return abs(a // self._columns - b // self._columns) + abs(a % self._columns - b % self._columns)

    def _neighbour(self, zone: int) -> int:
        candidates = [z for z in range(self.knobs.zones) if self._distance(zone, z) == 1]
        return self._rng.choice(candidates) if candidates else zone

    def _ping(self, now_ms: int) -> Emitted:
        rng = self._rng
        courier = rng.choice(self._couriers)
        if rng.random() < self.config.malformed_rate:
            good = self.project.encode(LOCATIONS, self._location(courier, now_ms, now_ms))
            broken = (good[: len(good) // 2], good + b"\x00", b"")[rng.randrange(3)]  # truncated, trailing bytes, empty
            return Emitted(LOCATIONS, courier.courier_id, broken, now_ms, None)
        if rng.random() < 0.05:
            courier.zone = self._neighbour(courier.zone)
        location = self._location(courier, now_ms, self.config.event_time(self._rng, now_ms))
        return Emitted(LOCATIONS, courier.courier_id, self.project.encode(LOCATIONS, location), now_ms, location)

    def _location(self, courier: _Courier, now_ms: int, at_ms: int):
        rng = self._rng
        row, column = divmod(courier.zone, self._columns)
        moving = rng.random() < 0.7
        return self._location_type(
            courier_id=courier.courier_id,
            pinged_at_ms=at_ms,
            zone=zone_name(courier.zone),
            lat=round(52.30 + 0.02 * row + rng.uniform(0, 0.02), 6),
            lon=round(4.80 + 0.03 * column + rng.uniform(0, 0.03), 6),
            speed_kmh=round(courier.pace_kmh * rng.uniform(0.6, 1.3), 1) if moving else 0.0,
        )

    def _kitchen_load(self, restaurant: _Restaurant, now_ms: int) -> int:
        """The restaurant's orders in the last fifteen minutes, this one included."""
        recent = self._kitchen.setdefault(restaurant.restaurant_id, deque())
        recent.append(now_ms)
        while recent[0] <= now_ms - _KITCHEN_WINDOW_MS:
            recent.popleft()
        return len(recent)

    def _order(self, now_ms: int) -> Emitted:
        rng, knobs = self._rng, self.knobs
        restaurant = self._restaurants[rng.choices(range(knobs.restaurants), cum_weights=self._restaurant_cum)[0]]
        if rng.random() < self.config.malformed_rate:
            return self._malformed_order(now_ms, restaurant)
        zone = restaurant.zone if rng.random() < 0.6 else self._neighbour(restaurant.zone)
        courier = rng.choice(self._couriers)
        items = min(100, 1 + int(rng.expovariate(0.5)))
        price, cuisine_minutes = CUISINES[restaurant.cuisine]
        order = self._order_type(
            order_id=self._uuid(),
            placed_at_ms=self.config.event_time(self._rng, now_ms),
            restaurant_id=restaurant.restaurant_id,
            customer_id=f"k{rng.randrange(50_000):05d}",
            courier_id=courier.courier_id,
            zone=zone_name(zone),
            items=items,
            subtotal=round(items * price * rng.lognormvariate(0.0, 0.2), 2),
            cuisine=restaurant.cuisine,
            note=rng.choice(["ring twice", "no onions", "leave at the door"]) if rng.random() < 0.1 else None,
        )
        emitted = Emitted(ORDERS, restaurant.restaurant_id, self.project.encode(ORDERS, order), now_ms, order)
        load = self._kitchen_load(restaurant, now_ms)
        minutes = (
            restaurant.prep_minutes
            + 0.8 * items
            + cuisine_minutes
            + 0.7 * (load - 1)
            + 60.0
            * 0.6
            * (self._distance(courier.zone, restaurant.zone) + self._distance(restaurant.zone, zone) + 0.5)
            / courier.pace_kmh
            + rng.gauss(0.0, 2.0)
        )
        if rng.random() >= knobs.cancel_rate:
            self._deliver(order, now_ms, max(1.0, minutes))
        return emitted

    def _deliver(self, order, placed_ms: int, minutes: float) -> None:
        """The order's delivery, published later (``label_delay_s``: a test's stream cannot wait the real minutes)."""
        at = placed_ms + int(self._rng.uniform(*self.config.label_delay_s) * 1000)
        delivery = self._delivery_type(
            order_id=order.order_id, courier_id=order.courier_id, delivered_at_ms=at, minutes_to_deliver=round(minutes, 2)
        )
        self._later.add(Emitted(DELIVERIES, order.order_id, self.project.encode(DELIVERIES, delivery), at, delivery))

    def _malformed_order(self, now_ms: int, restaurant: _Restaurant) -> Emitted:
        """A broken order of one of the kinds real producers send."""
        good = {
            "order_id": self._uuid(),
            "placed_at_ms": now_ms,
            "restaurant_id": restaurant.restaurant_id,
            "customer_id": "k00000",
            "courier_id": "c0000",
            "zone": zone_name(restaurant.zone),
            "items": 2,
            "subtotal": 20.0,
            "cuisine": restaurant.cuisine,
        }
        kind = self._rng.randrange(5)
        if kind == 0:
            value = json.dumps(good)[:-9].encode()  # truncated
        else:
            broken = dict(good)
            if kind == 1:
                broken["items"] = "two"
            elif kind == 2:
                del broken["restaurant_id"]
            elif kind == 3:
                broken["zone"] = "north"
            else:
                broken["cuisine"] = "tapas"
            value = json.dumps(broken).encode()
        return Emitted(ORDERS, restaurant.restaurant_id, value, now_ms, None)

    def __iter__(self) -> Iterator[Emitted]:
        clock = float(self.start_ms)
        rate_per_ms = self.config.rate_per_s / 1000.0
        while True:
            clock += self._rng.expovariate(rate_per_ms)
            now_ms = int(clock)
            yield from self._later.due(now_ms)
            yield self._ping(now_ms) if self._rng.random() < self.knobs.ping_share else self._order(now_ms)

    def score_request(self, emitted: Emitted, request_id: str, skew: Mapping[str, float]) -> ScoreRequest | None:
        """The estimate an order asks for when placed: its restaurant, zone and courier, its size, value (times
        ``skew``'s factor for ``subtotal``) and cuisine, naming the order; None for a ping, a delivery or a broken record."""
        if emitted.topic != ORDERS or emitted.record is None:
            return None
        order = emitted.record
        return ScoreRequest(
            schema_version=ScoreRequest.SCHEMA_VERSION,
            request_id=request_id,
            event_id=order.order_id,
            entity_keys={"restaurant_id": order.restaurant_id, "zone": order.zone, "courier_id": order.courier_id},
            request_fields={
                "items": order.items,
                "subtotal": order.subtotal * skew.get("subtotal", 1.0),
                "cuisine": order.cuisine,
            },
            requested_at_ms=int(time.time() * 1000),
        )

    def requests(self, rate_per_s: float, run_id: str, event_ids: bool = False) -> Iterator[Emitted]:
        """Estimate requests ``<run_id>-<n>`` for the world's restaurants (the popular asked about most), paced at
        ``rate_per_s`` and stamped as drawn. With ``event_ids`` each names an order of its own id (so a delivery of
        that id joins its prediction)."""
        rng = random.Random(run_id)
        emit_at_ms = time.time() * 1000
        for n in itertools.count():
            emit_at_ms += rng.expovariate(rate_per_s / 1000)
            restaurant = self._restaurants[rng.choices(range(self.knobs.restaurants), cum_weights=self._restaurant_cum)[0]]
            items = 1 + int(rng.expovariate(0.5))
            request = ScoreRequest(
                schema_version=ScoreRequest.SCHEMA_VERSION,
                request_id=f"{run_id}-{n}",
                entity_keys={
                    "restaurant_id": restaurant.restaurant_id,
                    "zone": zone_name(restaurant.zone),
                    "courier_id": rng.choice(self._couriers).courier_id,
                },
                request_fields={
                    "items": items,
                    "subtotal": round(items * CUISINES[restaurant.cuisine][0], 2),
                    "cuisine": restaurant.cuisine,
                },
                requested_at_ms=int(time.time() * 1000),
                event_id=f"{run_id}-{n}" if event_ids else None,
            )
            yield Emitted(SCORE_REQUESTS.name, request.request_id, encode(request), int(emit_at_ms), request)

    def label(self, event_id: str, n: int) -> Emitted:
        """A delivery of the order ``event_id``, handed over now, taking 15 to 44 minutes by ``n``."""
        now = int(time.time() * 1000)
        delivery = self._delivery_type(
            order_id=event_id, courier_id="c0000", delivered_at_ms=now, minutes_to_deliver=float(15 + n % 30)
        )
        return Emitted(DELIVERIES, event_id, self.project.encode(DELIVERIES, delivery), now, delivery)
