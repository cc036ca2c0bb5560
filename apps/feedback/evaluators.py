"""Automatic evaluators: after a run succeeds, each enabled evaluator of its team scores the stored
answer and records ``source=evaluator`` feedback.

Registered as an after-commit run observer (``FeedbackConfig.ready``): it runs once the run's
final row committed and can never break or slow the run itself. A held answer is never
evaluated (a judge would send it to a model before a reviewer released it, and a score is read
one guess at a time); the run's audit trail says so (``feedback.evaluation_skipped``). Regex and exact-match
evaluators compare with a reference answer: ``reference`` in the request's metadata
(``Run.api_request["metadata"]``); without one they skip.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from apps.audit.events import AuditEventType
from apps.audit.services import audit_run_event
from apps.engine.providers import ProviderRequestRefused
from apps.feedback.models import Evaluator, EvaluatorKind, FeedbackSource, MetricKind
from apps.feedback.services import feedback_record
from apps.governance.access_version import AccessCache
from apps.governance.models import Team
from apps.policies.guardrails.json_schema import scan
from apps.policies.guardrails.regex import UnsafePattern, compile_pattern
from apps.policies.outbound import audit_outbound, outbound_gate
from apps.runs.integration import policy_in_force
from apps.runs.models import Run, RunStatus
from apps.workers.engine_adapter import build_engine_pool
from apps.workers.models import Pool

logger = logging.getLogger(__name__)

HELD_NOTE = "the answer is held for review: evaluators do not score it"
JUDGE_MAX_TOKENS = 200
JUDGE_TIMEOUT_S = 60.0
JUDGE_SYSTEM = (
    "You grade an answer against a rubric. Reply with one line: SCORE: <a number from 0 to 1>, "
    "where 1 means the answer fully meets the rubric and 0 means it does not at all."
)
_SCORE = re.compile(r"score\s*[:=]\s*([01](?:\.\d+)?|\.\d+)", re.I)
_BARE = re.compile(r"^\s*([01](?:\.\d+)?|\.\d+)\s*$")


@dataclass(frozen=True)
class Outcome:
    """What one evaluator concluded: a value to record, or why nothing was recorded."""

    value: float | None
    note: str = ""


def reference_of(run: Run) -> str | None:
    record = run.api_request if isinstance(run.api_request, dict) else {}
    metadata = record.get("metadata") if isinstance(record.get("metadata"), dict) else {}
    ref = metadata.get("reference") if metadata else None
    return ref if isinstance(ref, str) and ref != "" else None


def _normalise(text: str) -> str:
    return " ".join(text.split()).casefold()


def evaluate_json_schema(answer: str, config: dict[str, Any]) -> Outcome:
    findings = scan(answer, config.get("schema"))
    return Outcome(0.0 if findings else 1.0, findings[0].label if findings else "valid JSON")


def evaluate_regex(answer: str, reference: str | None) -> Outcome:
    if reference is None:
        return Outcome(None, "no reference answer in the request metadata")
    try:
        # RE2 (linear time): the reference is user input.
        matched = compile_pattern(reference).search(answer) is not None
    except UnsafePattern as err:
        return Outcome(None, f"the reference is not a usable pattern: {err}")
    return Outcome(1.0 if matched else 0.0)


def evaluate_exact(answer: str, reference: str | None, config: dict[str, Any]) -> Outcome:
    if reference is None:
        return Outcome(None, "no reference answer in the request metadata")
    if config.get("normalize", True):
        return Outcome(1.0 if _normalise(answer) == _normalise(reference) else 0.0)
    return Outcome(1.0 if answer == reference else 0.0)


def parse_score(text: str) -> float | None:
    """A 0-1 score from a judge's reply (``SCORE: 0.8`` or a bare number), else None."""
    m = _SCORE.search(text) or _BARE.match(text)
    if m is None:
        return None
    score = float(m.group(1))
    return score if 0.0 <= score <= 1.0 else None


def judge_prompt(question: str, answer: str, rubric: str, reference: str | None) -> list[dict[str, str]]:
    parts = [f"Rubric:\n{rubric}", f"Question:\n{question}", f"Answer:\n{answer}"]
    if reference is not None:
        parts.append(f"Reference answer:\n{reference}")
    return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]


def evaluate_judge(run: Run, config: dict[str, Any], reference: str | None) -> Outcome:
    """Ask a worker of the run's pool (``config["worker"]`` or the pool's default) to score."""
    return judge_score(
        team=run.team,
        pool=run.pool,
        worker_slug=config.get("worker") or None,
        question=run.question,
        answer=run.answer,
        rubric=str(config.get("rubric") or ""),
        reference=reference,
        run_id=run.pk,
    )


def judge_score(
    *,
    team: Team,
    pool: Pool,
    worker_slug: str | None,
    question: str,
    answer: str,
    rubric: str,
    reference: str | None,
    run_id: Any,
    purpose: str = "evaluator",
) -> Outcome:
    """One judge call (team evaluators and experiments' LLM-as-judge scorer share it).

    The judge's request passes the team's outbound gate like every provider call (issue 39): the
    question, answer and reference reach the judge model as the run's workers would see them
    (redacted), or not at all (blocked); what the gate did is audited on the run."""

    gate = outbound_gate(policy_in_force(team).effective)
    engine_pool = build_engine_pool(pool, gate=gate)
    worker = engine_pool.get(worker_slug) if worker_slug else engine_pool.workers[engine_pool.default_index]
    if worker is None:
        return Outcome(None, f"the pool has no worker '{worker_slug}'")
    try:
        result = worker.complete(  # type: ignore[attr-defined]
            judge_prompt(question, answer, rubric, reference),
            max_tokens=JUDGE_MAX_TOKENS,
            timeout=JUDGE_TIMEOUT_S,
        )
    except ProviderRequestRefused as refused:
        audit_outbound(purpose=purpose, checks=refused.checks, blocked=True, team=team, run_id=run_id)
        return Outcome(None, f"the judge's request was refused: {refused}")
    audit_outbound(purpose=purpose, checks=result.outbound, blocked=False, team=team, run_id=run_id)
    score = parse_score(result.text or "")
    if score is None:
        return Outcome(None, "the judge's reply held no score between 0 and 1")
    return Outcome(score)


def evaluate(evaluator: Evaluator, run: Run) -> Outcome:
    reference = reference_of(run)
    config = evaluator.config if isinstance(evaluator.config, dict) else {}
    if evaluator.kind == EvaluatorKind.JSON_SCHEMA:
        return evaluate_json_schema(run.answer, config)
    if evaluator.kind == EvaluatorKind.REGEX:
        return evaluate_regex(run.answer, reference)
    if evaluator.kind == EvaluatorKind.EXACT_MATCH:
        return evaluate_exact(run.answer, reference, config)
    if evaluator.kind == EvaluatorKind.JUDGE:
        outcome = evaluate_judge(run, config, reference)
        if outcome.value is not None and evaluator.metric.kind == MetricKind.BOOLEAN:
            return Outcome(1.0 if outcome.value >= 0.5 else 0.0, f"judge score {outcome.value:g}")
        return outcome
    return Outcome(None, f"unknown evaluator kind '{evaluator.kind}'")


# team id -> its enabled evaluators (metric loaded), while the access version holds: the stamp
# changes with every write to feedback_evaluator or feedback_metric (migration 0003).
_enabled: AccessCache[tuple[Evaluator, ...]] = AccessCache()


def _enabled_evaluators(team_id: int, stamp: int | None = None) -> tuple[Evaluator, ...]:
    found = _enabled.get(stamp, team_id)
    if found is None:
        found = tuple(Evaluator.objects.filter(team_id=team_id, enabled=True).select_related("metric"))
        _enabled.put(stamp, team_id, found)
    return found


def run_evaluators(run_id: Any, team_id: int | None = None, stamp: int | None = None) -> list[Any]:
    """Evaluate a finished run with its team's enabled evaluators; returns the feedback recorded.
    ``team_id`` (the run's, when the caller knows it): a team without evaluators costs one read,
    or none with ``stamp`` (the access version read with the run) while it is current."""

    evaluators: tuple[Evaluator, ...] | None = None
    if team_id is not None:
        evaluators = _enabled_evaluators(team_id, stamp)
        if not evaluators:
            return []
    run = Run.objects.select_related("team", "pool").filter(pk=run_id).first()
    if run is None or run.status != RunStatus.SUCCEEDED:
        return []
    if evaluators is None or team_id != run.team_id:
        evaluators = _enabled_evaluators(run.team_id)
    if not evaluators:
        return []
    if run.answer_held:
        # Nothing is computed from a held answer (a score is read one guess at a time); the run's
        # record says which evaluators skipped it and why.
        logger.info("run %s: answer held for review, %d evaluator(s) skipped", run.pk, len(evaluators))
        with transaction.atomic():
            audit_run_event(
                event_type=AuditEventType.FEEDBACK_EVALUATION_SKIPPED,
                run=run,
                payload={"evaluators": [e.name for e in evaluators], "reason": HELD_NOTE},
            )
        return []
    recorded = []
    for evaluator in evaluators:
        try:
            outcome = evaluate(evaluator, run)
        except Exception as exc:  # a broken judge or provider records nothing
            logger.warning("run %s: evaluator %s failed: %s", run.pk, evaluator.name, exc)
            continue
        if outcome.value is None:
            logger.info("run %s: evaluator %s skipped: %s", run.pk, evaluator.name, outcome.note)
            continue
        recorded.append(
            feedback_record(
                run=run,
                metric_name=evaluator.metric.name,
                value=outcome.value,
                comment=outcome.note[:200],
                source=FeedbackSource.EVALUATOR,
                evaluator_name=evaluator.name,
            )
        )
    return recorded


def on_run_event(view: Any) -> None:
    """After-commit run observer: evaluate once the run finished successfully."""
    if view.type != "run.finished" or view.data.get("status") != "succeeded":
        return
    run_evaluators(view.run_id, view.team_id, view.access_stamp)


def dumps(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True)
