"""The rows and audit records each stored event type writes (the sink's handlers).

``EventRecords`` is mixed into ``RunSink``: each ``_on_<type>`` runs inside the batch's
transaction, once per stored event, and is found through ``_HANDLERS`` (written out, so a grep
for a handler finds its one caller).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, ClassVar
from uuid import UUID

from apps.audit.chain import content_sha256
from apps.audit.events import AuditEventType
from apps.audit.services import audit_record
from apps.core.compiled import CompiledInsert, update_where
from apps.engine.events import EventType
from apps.runs import observers
from apps.runs.journal import forget as forget_calls
from apps.runs.models import Run, RunStatus, Step
from apps.runs.reviews import maybe_sample_for_review, review_request, review_sample_rate
from apps.runs.sink.counters import _decimal
from apps.workers.models import Worker

# A run's fresh steps go in as plain INSERTs of a fixed shape: the ORM's per-call
# compilation of bulk_create/create cost more than the statements (issue #15).
_STEP_INSERT = CompiledInsert(Step)
# A sweep may already have ended the run (timed_out): the verdict is written only over a live run.
_LIVE = {"status": (RunStatus.QUEUED, RunStatus.RUNNING)}


def _ts(event: dict[str, Any]) -> datetime:
    return datetime.fromtimestamp(float(event["ts"]), tz=UTC)


# A method persisting one event type: (sink, event, event["data"]).
Handler = Callable[["EventRecords", dict[str, Any], dict[str, Any]], None]


class EventRecords:
    """The event handlers of ``RunSink`` (mixed in): Step and Run rows, audit records, the review
    queue. The attributes below are the sink's, set by ``RunSink.__init__``."""

    run_id: UUID
    team_id: int
    policy_version_id: int | None
    owner: str | None
    journal: Any
    flags: list[str]
    _planned: dict[int, dict[str, Any]]
    _fresh: bool
    _created_steps: dict[int, str]
    _verdict_written: bool
    _staged_verdict: dict[str, Any] | None
    _workers: Mapping[str, tuple[int, str, str]]

    def _worker_id(self, slug: str) -> int | None:
        known = self._workers.get(slug)
        if known is not None:
            return known[0]
        return Worker.objects.filter(slug=slug).values_list("pk", flat=True).first()

    def _is_held(self, data: dict[str, Any]) -> bool:
        return (
            data.get("status") or RunStatus.FAILED
        ) == RunStatus.SUCCEEDED and "require_review" in self.flags

    def _audit(self, event_type: AuditEventType, payload: dict[str, Any]) -> None:
        audit_record(
            event_type=event_type,
            team=self.team_id,
            object_type="runs.run",
            object_id=str(self.run_id),
            run_id=self.run_id,
            policy_version_id=self.policy_version_id,
            payload=payload,
        )

    def _on_run_started(self, event: dict[str, Any], data: dict[str, Any]) -> None:
        self._audit(
            AuditEventType.RUN_STARTED,
            {
                "strategy": data.get("strategy"),
                "preset": data.get("preset"),
                "workers": [w.get("key") for w in data.get("workers") or []],
                "conductor": (data.get("conductor") or {}).get("key"),
                "limits": data.get("limits"),
            },
        )

    def _on_guardrail_checked(self, event: dict[str, Any], data: dict[str, Any]) -> None:
        stage = data.get("stage")
        stage_events: dict[str | None, AuditEventType] = {
            "input": AuditEventType.RUN_INPUT_CHECKED,
            "step_output": AuditEventType.RUN_STEP_OUTPUT_CHECKED,
            "outbound": AuditEventType.RUN_OUTBOUND_CHECKED,  # the outbound gate (issue 39)
        }
        event_type = stage_events.get(stage, AuditEventType.RUN_OUTPUT_CHECKED)
        checks = [
            {k: c.get(k) for k in ("name", "stage", "status", "action", "detail")}
            for c in data.get("checks") or []
        ]
        self._audit(
            event_type,
            {
                "stage": stage,
                "step": data.get("step"),
                "checks": checks,
                "blocked": data.get("blocked"),
                "flags": data.get("flags"),
            },
        )

    @staticmethod
    def _plan_digest(plan: dict[str, Any] | None) -> list[dict[str, Any]] | None:
        if not plan:
            return None
        return [
            {
                "index": s.get("index"),
                "worker_key": s.get("worker_key"),
                "access": s.get("access"),
                "instruction": content_sha256(s.get("instruction")),
            }
            for s in plan.get("steps") or []
        ]

    def _on_plan_proposed(self, event: dict[str, Any], data: dict[str, Any]) -> None:
        self._audit(
            AuditEventType.RUN_PLAN_PROPOSED,
            {
                "round": data.get("round"),
                "attempt": data.get("attempt"),
                "source": data.get("source"),
                "plan": self._plan_digest(data.get("plan")),
                "error": data.get("error"),
                "usage": data.get("usage"),
            },
        )

    def _on_plan_validated(self, event: dict[str, Any], data: dict[str, Any]) -> None:
        for s in (data.get("plan") or {}).get("steps") or []:
            if isinstance(s, dict) and isinstance(s.get("index"), int):
                self._planned[s["index"]] = s
        self._audit(
            AuditEventType.RUN_PLAN_VALIDATED,
            {
                "round": data.get("round"),
                "action": data.get("action"),
                "violations": data.get("violations"),
                "original": self._plan_digest(data.get("original")),
                "plan": self._plan_digest(data.get("plan")),
                "reason": data.get("reason"),
            },
        )

    def _on_step_started(self, event: dict[str, Any], data: dict[str, Any]) -> None:
        fields = {
            "round": data.get("round") or 1,
            "worker_key": data.get("worker_key") or "",
            "worker_name": data.get("worker_name") or "",
            "instruction": data.get("instruction") or "",
            "access": data.get("access") or [],
            "messages": data.get("messages") or [],
            "status": "running",
            "started_at": _ts(event),
            "worker_id": self._worker_id(data.get("worker_key") or ""),
        }
        index = data["index"]
        if self._fresh and index not in self._created_steps:
            _STEP_INSERT.execute([Step(run_id=self.run_id, index=index, **fields)])
        else:
            Step.objects.update_or_create(run_id=self.run_id, index=index, defaults=fields)
        self._created_steps[index] = str(fields["worker_key"])
        self._audit(
            AuditEventType.RUN_STEP_STARTED,
            {
                "index": data["index"],
                "round": data.get("round"),
                "worker_key": data.get("worker_key"),
                "access": data.get("access"),
                "messages": content_sha256(_messages_text(data.get("messages"))),
            },
        )

    # Issue 44: a step waits for its worker's slot (no call yet), then runs once the call starts.
    def _on_step_waiting(self, event: dict[str, Any], data: dict[str, Any]) -> None:
        update_where(Step, (self.run_id, data["index"]), {"status": "waiting"}, where=("run", "index"))

    def _on_step_running(self, event: dict[str, Any], data: dict[str, Any]) -> None:
        update_where(Step, (self.run_id, data["index"]), {"status": "running"}, where=("run", "index"))

    def _on_step_finished(self, event: dict[str, Any], data: dict[str, Any]) -> None:
        usage = data.get("usage") or {}
        planned = self._planned.get(data["index"], {})
        access = planned.get("access")
        ended = {
            "status": data.get("status") or "failed",
            "output": data.get("output") or "",
            "error": data.get("error") or "",
            "fallback_from": data.get("fallback_from") or "",
            "input_tokens": int(usage.get("input_tokens") or 0),
            "output_tokens": int(usage.get("output_tokens") or 0),
            "cost_usd": _decimal(data.get("cost_usd")),
            "priced": bool(data.get("priced", True)),
            "latency_ms": data.get("latency_ms"),
            "finished_at": _ts(event),
        }
        if data.get("worker_key"):
            ended["worker_key"] = data["worker_key"]
        if data["index"] in self._created_steps:
            # This sink stored the step's start (with this worker, unless the end names another):
            # one UPDATE, no read (issue #15).
            ended.setdefault("worker_key", self._created_steps[data["index"]])
            update_where(Step, (self.run_id, data["index"]), ended, where=("run", "index"))
            step = Step(run_id=self.run_id, index=data["index"], **ended)
        else:
            step, _ = Step.objects.get_or_create(
                run_id=self.run_id,
                index=data["index"],
                defaults={
                    "round": data.get("round") or 1,
                    "worker_key": data.get("worker_key") or planned.get("worker_key") or "",
                    "instruction": planned.get("instruction") or "",
                    "access": access if isinstance(access, list) else [],
                },
            )
            for name, value in ended.items():
                setattr(step, name, value)
            step.save()
        self._audit(
            AuditEventType.RUN_STEP_FINISHED,
            {
                "index": data["index"],
                "status": step.status,
                "worker_key": step.worker_key,
                "fallback_from": data.get("fallback_from"),
                "usage": usage,
                "cost_usd": data.get("cost_usd"),
                "priced": step.priced,
                "latency_ms": step.latency_ms,
                "output": content_sha256(step.output),
                "error": step.error,
            },
        )

    def _on_run_finished(self, event: dict[str, Any], data: dict[str, Any]) -> None:
        totals = data.get("totals") or {}
        status = data.get("status") or RunStatus.FAILED
        held = self._is_held(data)
        reported = data.get("incomplete")
        incomplete: dict[str, Any] = reported if isinstance(reported, dict) else {}
        updates: dict[str, Any] = {
            "status": status,
            "status_reason": data.get("reason") or "",
            # A partial answer's run keeps why it is partial (the failed step) for its page.
            "error": data.get("error") or incomplete.get("detail") or "",
            "answer": data.get("answer") or "",
            "input_tokens": int(totals.get("input_tokens") or 0),
            "output_tokens": int(totals.get("output_tokens") or 0),
            "cost_usd": _decimal(totals.get("cost_usd")),
            "priced": bool(totals.get("priced", True)),
            "latency_ms": totals.get("latency_ms"),
            "step_count": int(totals.get("steps") or 0),
            "finished_at": _ts(event),
        }
        if held:
            updates["answer_held"] = True
        # A sweep may already have ended the run (timed_out): keep that verdict.
        ended = update_where(Run, self.run_id, updates, only_if=_LIVE)
        # The engine's totals replace what the batch's events add to the counters.
        self._verdict_written = bool(ended)
        self._audit(
            AuditEventType.RUN_FINISHED,
            {
                "status": status,
                "reason": data.get("reason"),
                "error": data.get("error"),
                "answer": content_sha256(data.get("answer")),
                # What streaming clients received of the answer (issue 45): for a run that
                # succeeded, the same digest as the answer's; for a blocked one, what got out.
                **({"released": data["released"]} if isinstance(data.get("released"), dict) else {}),
                "answer_held": held,
                "flags": list(self.flags),
                "totals": totals,
                # A partial answer (reason "partial"): which failure it stands in for (issue 44).
                "incomplete": data.get("incomplete"),
            },
        )
        self._staged_verdict = None
        if ended:
            # The resume journal is done with (and holds output).
            if self.journal is not None:
                self.journal.forget()
            else:
                forget_calls(self.run_id)
            if not self._queue_for_review():
                self._staged_verdict = updates

    def _on_run_awaiting_approval(self, event: dict[str, Any], data: dict[str, Any]) -> None:
        """The plan waits for an approver: the run pauses (lease given back, journal kept)."""
        observers.plan_hold()(
            run_id=self.run_id,
            team_id=self.team_id,
            policy_version_id=self.policy_version_id,
            owner=self.owner,
            at=_ts(event),
            data=data,
        )

    # Which method persists which event type, written out so each handler's one caller is the
    # lookup above and a grep for a handler finds it here. Types without one only go to the log.
    _HANDLERS: ClassVar[Mapping[str, Handler]] = {
        EventType.RUN_STARTED: _on_run_started,
        EventType.GUARDRAIL_CHECKED: _on_guardrail_checked,
        EventType.PLAN_PROPOSED: _on_plan_proposed,
        EventType.PLAN_VALIDATED: _on_plan_validated,
        EventType.STEP_STARTED: _on_step_started,
        EventType.STEP_WAITING: _on_step_waiting,
        EventType.STEP_RUNNING: _on_step_running,
        EventType.STEP_FINISHED: _on_step_finished,
        EventType.RUN_FINISHED: _on_run_finished,
        EventType.RUN_AWAITING_APPROVAL: _on_run_awaiting_approval,
    }

    def _queue_for_review(self) -> bool:
        """warn / require_review guardrails put the run in the review queue; others may be
        sampled. True when the run row may have been changed for it."""
        review_flags = [flag for flag in self.flags if flag in REVIEW_FLAGS]
        if review_flags:
            review_request(
                run=Run.objects.get(pk=self.run_id), reason="guardrail", details={"flags": review_flags}
            )
            return True
        if review_sample_rate() > 0:  # most deployments sample nothing: no read then
            maybe_sample_for_review(Run.objects.get(pk=self.run_id))
            return True
        return False


# Guardrail actions that ask a person to look at the run.
REVIEW_FLAGS = ("warn", "require_review")


def _messages_text(messages: Any) -> str:
    if not isinstance(messages, list):
        return ""
    return "\n".join(f"{m.get('role')}: {m.get('content')}" for m in messages if isinstance(m, dict))
