"""Which generation of each stream feature view readers serve, and how far each generation has absorbed its topic.

A *generation* is a view's rows as one plan computed them (``FeaturePlan.rows_identity``: the topic, keys, event time,
aggregations and feature names its rows mean), written under a namespace of their own in the entity's hash: the view's first
generation under Feast's own name for the view (what Feast's ``get_online_features`` reads), each later one under
``<view>@g<n>``. A changed plan never writes over the rows readers serve: the feature job rebuilds the view from the
retained events into a new, *pending* generation while readers go on reading the serving one, and makes the pending
one serving once it has caught up with its topic (``streams/jvm`` ``ProgressSink``, one compare-and-set). A reader so
moves from one plan's complete rows to the next plan's complete rows, never through a half-filled window, and never
reads a value under a name its plan does not give it.

One hash per project, ``loopline:views:<project>``, holds it all (one key: on a Redis Cluster, one slot):

* ``serving:<view>`` and ``pending:<view>``: a generation (:class:`Generation`, JSON), with what a reader needs to read
  its rows without the registry (the registry already holds the next plan while the previous one serves);
* ``progress:<namespace>``: ``<progress ms>:<published at ms>``, the event time up to which the rows under that
  namespace have absorbed every event of the topic (the job publishes it once a second);
* ``written:<namespace>:<subtask>``: ``<read mark>:<subtasks>``, the job's own bookkeeping: the newest read mark
  (``streams/jvm`` ``ReadMarks``) behind which that subtask of the namespace's row writer has every row in Redis, of
  how many subtasks. The progress is published from these, so it is of rows written, not of events merely read.

A view with no ``serving`` entry (rows written before generations were kept, or by hand) is read under Feast's name,
as the registry defines it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from feature_store.window_tiles import AggregationSpec

#: The hash's fields: a view's serving and pending generations, a namespace's progress, and its writers' read marks.
SERVING, PENDING, PROGRESS, WRITTEN = "serving:", "pending:", "progress:", "written:"


def views_key(project: str) -> str:
    """The hash of the Feast project ``project``'s views."""
    return f"loopline:views:{project}"


@dataclass(frozen=True)
class Generation:
    """One generation of a view: its number, namespace and plan identity, and its rows' read layout (join keys, and the
    aggregations in the job's order, which are the view's features)."""

    view: str
    number: int
    namespace: str
    identity: str
    join_keys: tuple[str, ...]
    aggregations: tuple[AggregationSpec, ...]

    def to_json(self) -> str:
        """The generation as the hash keeps it (the job's promotion compares this text)."""
        return json.dumps(
            {
                "view": self.view,
                "number": self.number,
                "namespace": self.namespace,
                "identity": self.identity,
                "join_keys": list(self.join_keys),
                "aggregations": [[a.name, a.function, a.column, a.window_ms, a.slide_ms] for a in self.aggregations],
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> Generation:
        data = json.loads(text)
        return cls(
            data["view"],
            data["number"],
            data["namespace"],
            data["identity"],
            tuple(data["join_keys"]),
            tuple(AggregationSpec(*a) for a in data["aggregations"]),
        )


def namespace(stored_name: str, number: int) -> str:
    """Where generation ``number`` of a view Feast stores as ``stored_name`` keeps its rows."""
    return stored_name if number == 0 else f"{stored_name}@g{number}"


@dataclass(frozen=True)
class ViewStates:
    """The hash, read: each view's serving and pending generation, and each namespace's progress."""

    serving: Mapping[str, Generation] = field(default_factory=dict)
    pending: Mapping[str, Generation] = field(default_factory=dict)
    #: namespace -> (progress ms, published at ms)
    progress: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    @classmethod
    def parse(cls, fields: Mapping[bytes, bytes]) -> ViewStates:
        """The states from the hash's fields as HGETALL returns them."""
        serving, pending, progress = {}, {}, {}
        for raw_name, value in fields.items():
            name = raw_name.decode()
            if name.startswith(SERVING):
                serving[name[len(SERVING) :]] = Generation.from_json(value)
            elif name.startswith(PENDING):
                pending[name[len(PENDING) :]] = Generation.from_json(value)
            elif name.startswith(PROGRESS):
                at, published = value.decode().split(":")
                progress[name[len(PROGRESS) :]] = (int(at), int(published))
        return cls(serving, pending, progress)


def read_view_states(redis, project: str) -> ViewStates:
    """The project's view states, from its hash (one HGETALL)."""
    return ViewStates.parse(redis.hgetall(views_key(project)))


@dataclass(frozen=True)
class PlannedView:
    """What the feature job is about to compute for one view: its plan identity and read layout, and Feast's name for
    it."""

    view: str
    identity: str
    stored_name: str
    join_keys: tuple[str, ...]
    aggregations: tuple[AggregationSpec, ...]


def plan_generations(redis, project: str, views: Sequence[PlannedView]) -> dict[str, tuple[Generation, bool]]:
    """The generation the job writes for each of ``views``, and whether it is pending, recorded in the hash: the serving
    one where its plan is the job's; else the pending one of the job's plan (a rebuild that was interrupted goes on
    under its namespace); else a new one, pending behind the serving generation (or serving at once when the view has
    none: there is nothing else to read, and reads are flagged stale until the job has caught up). A pending generation
    of another plan is dropped (its rebuild was given up)."""
    states = read_view_states(redis, project)
    key, chosen = views_key(project), {}
    for planned in views:
        serving, pending = states.serving.get(planned.view), states.pending.get(planned.view)
        if serving is not None and serving.identity == planned.identity:
            chosen[planned.view] = (serving, False)
        elif serving is not None and pending is not None and pending.identity == planned.identity:
            chosen[planned.view] = (pending, True)
            continue
        else:
            number = max((g.number + 1 for g in (serving, pending) if g is not None), default=0)
            generation = Generation(
                planned.view,
                number,
                namespace(planned.stored_name, number),
                planned.identity,
                planned.join_keys,
                planned.aggregations,
            )
            chosen[planned.view] = (generation, serving is not None)
            if serving is not None:
                redis.hset(key, PENDING + planned.view, generation.to_json())
                continue
            redis.hset(key, SERVING + planned.view, generation.to_json())
        if pending is not None:
            redis.hdel(key, PENDING + planned.view)
    return chosen
