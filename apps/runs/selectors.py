"""Run reads. Visibility comes only from apps.governance.selectors."""

from __future__ import annotations

import dataclasses
from datetime import date, datetime, time, timedelta
from typing import Any
from uuid import UUID

from django.db.models import Q, QuerySet, TextField
from django.db.models.fields.json import KeyTextTransform, KeyTransform
from django.db.models.functions import Cast
from django.utils import timezone

from apps.audit.models import AuditEvent
from apps.core.types import Viewer
from apps.policies.guardrails.stream import policy_buffered_reason
from apps.runs import integration, search
from apps.runs.models import ApprovalDecision, PlanApproval, Run, RunEvent, RunStatus, Step

SORTS = {
    "newest": "-created_at",
    "oldest": "created_at",
    "cost": "-cost_usd",
    "tokens": "-output_tokens",
    "latency": "-latency_ms",
}
DECISION_TYPES = ("guardrail.checked", "plan.proposed", "plan.validated", "run.finished")


def _start_of(day: date) -> datetime:
    return timezone.make_aware(datetime.combine(day, time.min))


def run_get_visible(*, user: Viewer, run_id: UUID | str) -> Run | None:
    """``run_id``: the full id, or a short one (the 8 characters the pages show) that names
    exactly one run the user may view."""
    qs = Run.objects.visible_to(user, "view").select_related("team", "pool", "created_by", "worker")
    if isinstance(run_id, UUID):
        return qs.filter(pk=run_id).first()
    run, _count = search.resolve_run_ref(qs, run_id)
    return run


def by_metadata(qs: QuerySet[Run], key: str, value: str) -> QuerySet[Run]:
    """Runs whose /v1 request carried ``metadata[key] == value`` (its ``user`` is recorded as
    ``metadata["user"]``, apps.api.v1.chat). The key is a bound parameter, never SQL."""
    # Cast: compare text with text (a bare key transform would compare JSON with JSON).
    value_of = Cast(KeyTextTransform(key, KeyTransform("metadata", "api_request")), TextField())
    return qs.alias(_meta=value_of).filter(_meta=value)


def by_api_key(qs: QuerySet[Run], key: str) -> QuerySet[Run]:
    """The key's prefix (what the key list shows) or its name."""
    return qs.filter(Q(api_key__prefix=key) | Q(api_key__name=key))


def by_model(qs: QuerySet[Run], model: str) -> QuerySet[Run]:
    """A worker's slug or its provider model name, used by any step or named by the run."""
    steps = Step.objects.filter(Q(worker_key=model) | Q(worker__model_name=model)).values("run_id")
    return qs.filter(Q(pk__in=steps) | Q(worker__model_name=model) | Q(worker__slug=model))


def run_list(
    *,
    user: Viewer,
    team: str | None = None,
    created_by: str | None = None,
    status: str | None = None,
    strategy: str | None = None,
    worker: str | None = None,
    date_from: date | None = None,
    date_to: date | None = None,
    sort: str = "newest",
    text: str | None = None,
    run_ref: str | None = None,
    pool: str | None = None,
    api_key: str | None = None,
    model: str | None = None,
    request_id: str | None = None,
    metadata: tuple[str, str] | None = None,
    client_user: str | None = None,
) -> QuerySet[Run]:
    """Visible runs, filtered. Every filter rides an index of Run (see models.Meta.indexes);
    ``text`` the full-text indexes (apps.runs.search). ``run_ref``: a full or short run id
    (raises ``search.BadRunRef`` if it is neither)."""
    qs = Run.objects.visible_to(user, "view")
    if run_ref:
        qs = search.filter_run_ref(qs, run_ref)
    if text:
        qs = search.text_search(qs, user=user, text=text)
    if team:
        qs = qs.filter(team__slug=team)
    if created_by:
        qs = qs.filter(created_by__username=created_by)
    if pool:
        qs = qs.filter(pool__slug=pool)
    if api_key:
        qs = by_api_key(qs, api_key)
    if model:
        qs = by_model(qs, model)
    if request_id:
        qs = qs.filter(request_id=request_id)
    if metadata:
        qs = by_metadata(qs, *metadata)
    if client_user:
        qs = by_metadata(qs, "user", client_user)
    if status:
        qs = qs.filter(status=status)
    if strategy:
        qs = qs.filter(strategy=strategy)
    if worker:
        # A subquery on the (worker_key, run) index instead of a join that would duplicate rows.
        qs = qs.filter(pk__in=Step.objects.filter(worker_key=worker).values("run_id"))
    # Bounds on the column itself (not created_at__date) so the created_at indexes apply.
    if date_from:
        qs = qs.filter(created_at__gte=_start_of(date_from))
    if date_to:
        qs = qs.filter(created_at__lt=_start_of(date_to + timedelta(days=1)))
    return (
        qs.select_related("team", "pool", "created_by")
        .order_by(SORTS.get(sort, "-created_at"))
        # The question is listed (a line of it); the answer never is (held answers).
        .defer("answer", "replay_messages", "error", "status_reason", "api_request")
    )


def run_snapshot(
    *, user: Viewer, run_id: UUID | str | None = None, run: Run | None = None
) -> tuple[dict[str, Any], ViewerAccess]:
    """What a websocket viewer starts from, and what that viewer may see of it.

    last_seq is read FIRST (with the run row the access is decided on): steps read afterwards can
    only be newer, and re-applying the later events on the client is idempotent. Content is
    withheld per ``access`` (see ``run_content_visible``). ``run``: the row just read (with team,
    pool and created_by) by a caller that checked the viewer's permission on it, so the handshake
    reads it once."""
    if run is None:
        if run_id is None:
            raise TypeError("run_snapshot needs run or run_id")
        run = Run.objects.select_related("team", "pool", "created_by").get(pk=run_id)
    # One read for the decisions and the run.started event that says whether the run can be held.
    # plan.started too: a late viewer must see a planning node that is still running.
    decisions = []
    started: Any = _NOT_READ
    for e in RunEvent.objects.filter(
        run_id=run.pk,
        # tool.called too (issue 43): a late viewer sees the tool-call nodes of the graph.
        # plan.waiting / plan.running (issue 44): whether a late viewer's planning node waits for
        # its model or runs.
        type__in=(
            *DECISION_TYPES[:3],
            "plan.started",
            "plan.waiting",
            "plan.running",
            "plan.delta",
            "run.started",
            "tool.called",
        ),
        seq__lte=run.last_seq,
    ).order_by("seq"):
        if e.type == "run.started":
            started = e.data
        else:
            decisions.append(event_dict(e))
    access = viewer_access(user=user, run=run, started=started)
    steps = [step_dict(s) for s in Step.objects.filter(run_id=run.pk).order_by("index")]
    if access.withheld:
        steps = [withhold_step(s) for s in steps]
        decisions = [withhold_event(e) for e in decisions]
    snapshot = {
        "type": "snapshot",
        "run": run_dict(run, show_content=not access.withheld),
        "steps": steps,
        "decisions": decisions,
        "last_seq": run.last_seq,
        # The answer released so far (issue 45), so a viewer joining mid-answer shows all of it.
        "answer_live": "" if access.withheld or run.is_terminal else released_answer(run.pk, run.last_seq),
    }
    return snapshot, access


def released_answer(run_id: UUID | str, upto: int) -> str:
    """The answer text the output gate released up to ``seq`` ``upto`` (``step.delta`` events
    marked ``answer``: never unchecked text)."""
    rows = RunEvent.objects.filter(run_id=run_id, type="step.delta", seq__lte=upto).order_by("seq")
    return "".join(
        str(data.get("text") or "")
        for data in rows.values_list("data", flat=True)
        if isinstance(data, dict) and data.get("answer") is True
    )


def run_events_after(run_id: UUID | str, after: int, *, limit: int = 10_000) -> list[dict[str, Any]]:
    """Unfiltered: callers withhold content per viewer (``withhold_event``)."""
    return [
        event_dict(e) for e in RunEvent.objects.filter(run_id=run_id, seq__gt=after).order_by("seq")[:limit]
    ]


def run_decisions(run: Run) -> list[RunEvent]:
    return list(RunEvent.objects.filter(run=run, type__in=DECISION_TYPES[:3]).order_by("seq"))


def run_audit_events(*, user: Viewer, run: Run) -> QuerySet[Any]:
    return AuditEvent.objects.visible_to(user, "view").filter(run_id=run.id).order_by("seq")


def event_dict(e: RunEvent) -> dict[str, Any]:
    return {
        "type": e.type,
        "run_id": str(e.run_id),
        "seq": e.seq,
        "ts": e.created_at.timestamp(),
        "data": e.data,
    }


def _iso(value: Any) -> str | None:
    return value.isoformat() if value else None


def run_dict(run: Run, *, show_content: bool) -> dict[str, Any]:
    """``show_content``: the caller decided with ``run_content_visible`` (reviewers see a held
    answer so they can decide on it)."""
    return {
        "id": str(run.id),
        "status": run.status,
        "status_reason": run.status_reason,
        "error": run.error,
        "strategy": run.strategy,
        "preset": run.preset,
        "team": run.team.slug,
        "pool": run.pool.slug,
        "created_by": run.created_by.get_username() if run.created_by else None,
        "question": run.question,
        "answer": run.answer if show_content else "",
        "answer_held": run.answer_held,
        "content_withheld": not show_content,
        "held_rules": run_hold_rules(run.pk) if run.answer_held else [],
        "input_tokens": run.input_tokens,
        "output_tokens": run.output_tokens,
        "cost_usd": str(run.cost_usd) if run.cost_usd is not None else None,
        "priced": run.priced,
        "latency_ms": run.latency_ms,
        "step_count": run.step_count,
        "last_seq": run.last_seq,
        "created_at": _iso(run.created_at),
        "started_at": _iso(run.started_at),
        "finished_at": _iso(run.finished_at),
        "cancel_requested": run.cancel_requested,
    }


def step_dict(s: Step) -> dict[str, Any]:
    return {
        "index": s.index,
        "round": s.round,
        "worker_key": s.worker_key,
        "worker_name": s.worker_name,
        "instruction": s.instruction,
        "access": s.access,
        "messages": s.messages,
        "output": s.output,
        "status": s.status,
        "error": s.error,
        "fallback_from": s.fallback_from or None,
        "usage": {"input_tokens": s.input_tokens, "output_tokens": s.output_tokens},
        "cost_usd": str(s.cost_usd) if s.cost_usd is not None else None,
        "priced": s.priced,
        "latency_ms": s.latency_ms,
    }


# --- held content ---------------------------------------------------------------------------------
#
# A ``require_review`` guardrail holds a run's answer until a reviewer releases it. The final
# step's output IS the answer and earlier outputs (and the messages that carry them to later
# workers) may contain the same text, so for a viewer who may not see it, *all* model output of
# the run is withheld: step outputs, live deltas, worker messages, the answer, the conductor's raw
# plans and the instructions of re-planned rounds (a re-planning conductor has read the outputs).
# Live events are published before the output guardrail decides, so content is withheld from the
# moment a run *may* be held: its policy has a require_review guardrail.

HOLD_ACTION = "require_review"
HOLD_STAGES = ("input", "step_output", "output")
WITHHELD_JUDGE_DETAIL = "judge verdict withheld until the run is released"


@dataclasses.dataclass(frozen=True, slots=True)
class ViewerAccess:
    reviewer: bool | None  # may review the run: always sees its content (None: not asked, cannot matter)
    holdable: bool  # the run's policy can hold its answer
    withheld: bool  # content is withheld from this viewer now
    settled: bool = False  # decided from a started or finished run (its events cannot change it)
    answer_held: bool = False  # now, not when run.finished was recorded


def policy_hold_rules(spec: Any) -> list[str]:
    """``<stage>:<check>`` for every enabled guardrail of a policy spec that holds the answer."""
    rules = []
    for stage in HOLD_STAGES:
        checks = getattr(spec.guardrails, stage)
        for name in type(checks).model_fields:  # the spec sections are pydantic models
            check = getattr(checks, name)
            if getattr(check, "enabled", False) and getattr(check, "action", None) == HOLD_ACTION:
                rules.append(f"{stage}:{name}")
    return rules


def team_may_hold(team: Any, stamp: int | None = None) -> bool:
    """Whether a run started now on ``team`` could have its answer held (``stamp``: the access
    version read with the run, if any)."""
    try:
        spec = integration.policy_in_force(team, stamp).effective.spec
    except ValueError:
        return True  # a policy that no longer validates: assume the strictest
    return bool(policy_hold_rules(spec))


def answer_buffered_reason(run: Run) -> str | None:
    """Why ``run``'s answer cannot stream to its client as it is written (issue 45): the policy
    it runs under has checks that need the whole answer, or may hold it. None: it streams."""
    try:
        spec = integration.policy_in_force(run.team, getattr(run, "access_stamp", None)).effective.spec
    except ValueError:
        return "the policy no longer validates"
    return policy_buffered_reason(spec.guardrails)


def approved_digests(run_id: UUID | str) -> set[str]:
    """The plans an approver let through for this run (the hooks accept exactly these)."""
    return set(
        PlanApproval.objects.filter(
            run_id=run_id, decision=ApprovalDecision.APPROVED, kind="plan"
        ).values_list("digest", flat=True)
    )


_NOT_READ: Any = object()  # run_may_be_held: the caller did not read run.started


def run_may_be_held(run: Run, *, started: Any = _NOT_READ) -> bool:
    """Whether ``run``'s answer is, or could still be, held. The sink records the verdict of the
    policy the run executes under on its ``run.started`` event; before that (queued) or for runs
    recorded without it, the team's policy in force decides. ``started``: the data of that event
    when the caller already read it (``run_snapshot``)."""
    if run.answer_held:
        return True
    if started is _NOT_READ:
        started = (
            RunEvent.objects.filter(run_id=run.pk, type="run.started").values_list("data", flat=True).first()
        )
    if isinstance(started, dict) and "holdable" in started:
        return bool(started["holdable"])
    return team_may_hold(run.team)


def _withheld(run: Run, holdable: bool) -> bool:
    # A succeeded run that is not held passed its output guardrails (or a reviewer released it).
    # A holdable run that ended otherwise (cancelled, failed, timed out) never had its answer
    # reviewed, so its step outputs stay withheld.
    return run.answer_held or (run.status != RunStatus.SUCCEEDED and holdable)


def viewer_access(*, user: Viewer, run: Run, started: Any = _NOT_READ) -> ViewerAccess:
    """``reviewer`` is asked (object permissions: the handshake's costliest queries) only when it
    can matter: content withheld now, or a queued run whose policy decides at ``run.started``.
    ``started``: see ``run_may_be_held``."""
    holdable = run.answer_held or (
        run.status != RunStatus.SUCCEEDED and run_may_be_held(run, started=started)
    )
    withheld = _withheld(run, holdable)
    settled = run.status != RunStatus.QUEUED
    reviewer = Run.objects.allows(user, "review", run) if withheld or not settled else None
    return ViewerAccess(
        reviewer,
        holdable,
        withheld and not reviewer,
        settled=settled,
        answer_held=run.answer_held,
    )


def run_content_visible(*, user: Viewer, run: Run) -> bool:
    """THE rule every surface applies: may ``user`` (who may view ``run``) see its model output
    — step outputs, deltas, worker messages, the answer? No while the answer is held or may
    still be held, unless the user may review the run."""
    if not run.answer_held and run.status == RunStatus.SUCCEEDED:
        return True  # the common case costs no query
    if not _withheld(run, run_may_be_held(run)):
        return True
    return Run.objects.allows(user, "review", run)


def run_hold_rules(run_id: UUID | str) -> list[str]:
    """``<stage>:<check>`` of the guardrails that flagged the run for review (names, never findings)."""
    rules: list[str] = []
    for data in RunEvent.objects.filter(run_id=run_id, type="guardrail.checked").values_list(
        "data", flat=True
    ):
        if not isinstance(data, dict):
            continue
        for check in data.get("checks") or []:
            if (
                isinstance(check, dict)
                and check.get("status") == "intervened"
                and check.get("action") == HOLD_ACTION
            ):
                rule = f"{data.get('stage')}:{check.get('name')}"
                if rule not in rules:
                    rules.append(rule)
    return rules


def held_reason(rules: list[str]) -> str:
    named = ", ".join(rules) if rules else "a require_review guardrail"
    return f"The answer is held for review by policy rule {named} (action require_review) until a reviewer releases it."


def _later_round(round_: Any) -> bool:
    return isinstance(round_, int) and round_ > 1


def withhold_step(step: dict[str, Any]) -> dict[str, Any]:
    """A step (``step_dict`` / REST shape) without the content a non-reviewer may not see."""
    out = dict(step)
    out["output"] = ""
    out["messages"] = []
    if _later_round(step.get("round")):
        out["instruction"] = ""
    out["withheld"] = True
    return out


def _withhold_plan(plan: Any) -> Any:
    if not isinstance(plan, dict):
        return plan
    steps = [{**s, "instruction": ""} if isinstance(s, dict) else s for s in plan.get("steps") or []]
    return {**plan, "steps": steps}


def withhold_event_data(kind: str, data: Any) -> Any:
    """The data of one protocol event without the content a non-reviewer may not see."""
    if not isinstance(data, dict):
        return data
    out = dict(data)
    if kind in ("step.delta", "plan.delta"):
        out["text"] = ""
    elif kind == "step.started":
        out["messages"] = []
        if _later_round(data.get("round")):
            out["instruction"] = ""
    elif kind == "step.finished":
        out["output"] = ""
    elif kind == "tool.called":
        # A tool's arguments are model output and its result is content (issue 43).
        out["arguments"] = {}
        out["output"] = ""
    elif kind == "run.finished":
        out["answer"] = None
        if data.get("tool_calls"):
            out["tool_calls"] = None  # tool-call arguments are model output (issue 22)
    elif kind == "plan.proposed":
        out["raw"] = ""
        if _later_round(data.get("round")):
            out["plan"] = _withhold_plan(data.get("plan"))
    elif kind == "plan.started":
        if _later_round(data.get("round")):
            out["messages"] = []  # a re-plan's prompt quotes earlier step outputs
        else:
            return data  # round 1: the question and the worker list, which every viewer sees
    elif kind == "plan.validated":
        if _later_round(data.get("round")):
            out["plan"] = _withhold_plan(data.get("plan"))
            out["original"] = _withhold_plan(data.get("original"))
    elif kind == "guardrail.checked":
        # A model judge's reason may quote the text it judged.
        out["checks"] = [
            {**c, "detail": WITHHELD_JUDGE_DETAIL}
            if isinstance(c, dict) and c.get("name") == "model_judge" and c.get("detail")
            else c
            for c in data.get("checks") or []
        ]
    else:
        return data
    out["withheld"] = True
    return out


def withhold_event(event: dict[str, Any]) -> dict[str, Any]:
    return {**event, "data": withhold_event_data(event["type"], event.get("data"))}
