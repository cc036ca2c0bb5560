"""The engine's EventSink on the Django side (a package re-exported here, NetBox style).

- ``run_sink``: ``RunSink``, buffering a run's events and storing them in one transaction per
  step boundary, fenced by the run's lease;
- ``records``: the rows and audit records each event type writes (``RunSink``'s handlers);
- ``counters``: what a batch adds to the run row's counters (one fenced UPDATE);
- ``publishing``: committed events to the channel-layer group ``run.<id>``, and the names the
  websocket side shares with it.

Import from here; patch a name in the module that looks it up (e.g. ``run_sink.publish_batch``).
"""

from __future__ import annotations

from apps.runs.sink.counters import NO_USAGE, BatchUsage
from apps.runs.sink.publishing import (
    ACCESS_STAMP,
    group_name,
    message_events,
    on_run_saved,
    publish,
    publish_batch,
    publish_review,
    register_server_loop,
    send_to_group,
)
from apps.runs.sink.records import REVIEW_FLAGS, EventRecords
from apps.runs.sink.run_sink import DELTA_FLUSH_S, TAPPED_DELTA_FLUSH_S, RunSink

__all__ = [
    "ACCESS_STAMP",
    "DELTA_FLUSH_S",
    "NO_USAGE",
    "REVIEW_FLAGS",
    "TAPPED_DELTA_FLUSH_S",
    "BatchUsage",
    "EventRecords",
    "RunSink",
    "group_name",
    "message_events",
    "on_run_saved",
    "publish",
    "publish_batch",
    "publish_review",
    "register_server_loop",
    "send_to_group",
]
