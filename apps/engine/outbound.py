"""The run's record of the outbound gate (issue 39).

Every provider call of a run passes the gate (``apps.engine.providers.gate``) inside the worker.
What the gate did comes back with the call: ``WorkerResult.outbound`` (redactions, warnings) or a
``ProviderRequestRefused`` (nothing was sent). The executor and the planning call hand both here,
and the run records them as a ``guardrail.checked`` event of stage ``outbound``: the step it
concerns (None for planning), one check per intervention naming the request field and the rule,
never the content. The sink audits it like every guardrail event. A call the gate let through
untouched adds nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from apps.engine.checks import CheckResult
from apps.engine.events import EventType

FLAG_ACTIONS = ("warn", "require_review")
BLOCKED_REASON = "outbound_blocked"


def report(session: Any, *, step: int | None, checks: Sequence[CheckResult], blocked: bool) -> None:
    """Emit the gate's checks for one call of ``session``'s run (nothing when there are none)."""
    if not checks:
        return
    flags: list[str] = []
    for check in checks:
        if check.action in FLAG_ACTIONS and check.action not in flags:
            flags.append(check.action)
    session.flags.extend(f for f in flags if f not in session.flags)
    session.emitter.emit(
        EventType.GUARDRAIL_CHECKED,
        {
            "stage": "outbound",
            "step": step,
            "checks": [c.to_dict() for c in checks],
            "blocked": blocked,
            "flags": flags,
        },
    )
