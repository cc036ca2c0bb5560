"""Event serialisation and the emitter's ordering guarantee."""

from __future__ import annotations

import json
import threading
from decimal import Decimal

from apps.engine.events import Emitter, EventType, ListSink, RunStatus, json_safe
from apps.engine.types import Totals, Usage


def test_to_dict_is_json_safe() -> None:
    sink = ListSink()
    event = Emitter("r", sink).emit(
        EventType.STEP_FINISHED,
        {"cost_usd": Decimal("0.0012"), "status": RunStatus.FAILED, "access": (0, 1), "usage": Usage(3, 4)},
    )
    d = event.to_dict()
    assert d["type"] == "step.finished" and d["seq"] == 1 and d["run_id"] == "r"
    assert d["data"] == {
        "cost_usd": "0.0012",
        "status": "failed",
        "access": [0, 1],
        "usage": {"input_tokens": 3, "output_tokens": 4},
    }
    json.dumps(d)
    assert json_safe({1: {2}}) == {"1": [2]}


def test_emitter_seq_is_gapless_across_threads() -> None:
    sink = ListSink()
    emitter = Emitter("r", sink)

    def burst() -> None:
        for _ in range(200):
            emitter.emit(EventType.STEP_DELTA, {"index": 0, "text": "x"})

    threads = [threading.Thread(target=burst) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [e.seq for e in sink.events] == list(range(1, 1601))  # the sink sees them in seq order
    assert emitter.last_seq == 1600


def test_totals_never_report_unpriced_as_zero() -> None:
    t = Totals()
    t.add(Usage(10, 1), None, False)
    assert t.to_dict()["cost_usd"] is None and t.to_dict()["priced"] is False
    t.add(Usage(1, 1), Decimal("0.5"), True)
    assert t.to_dict()["cost_usd"] == "0.5" and t.to_dict()["priced"] is False
    free = Totals()
    free.add(Usage(1, 1), Decimal(0), True)
    assert free.to_dict()["cost_usd"] == "0" and free.to_dict()["priced"] is True
