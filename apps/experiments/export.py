"""Training export (issue 19): a team's reviewed traffic and experiment results as JSONL, to train
a conductor model elsewhere (GRPO-style: prompts, plans, rewards) or fine-tune a worker (OpenAI
chat fine-tuning format).

What is never exported: a held answer (``answer_held``), a run whose content retention erased
(``payload_erased_at``), a run that did not succeed, and — for the chat format — a run whose
question an input guardrail masked unless the masked text the workers saw is on record (the
conductor's prompt in ``plan.started``); the export says how many it skipped and why.

Rewards: the mean of the run's feedback on the team's learning metric (``learning.metric`` in the
policy, default ``helpful``), else on ``review_approved`` (a reviewer's sign-off is 1, a flag 0),
else the experiment's score for that run. Metrics that optimise ``min`` are flipped so higher is
better. A run without any of these has no reward and is left out of the conductor export.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from apps.experiments.models import ExperimentRun
from apps.feedback.models import Feedback
from apps.policies.services import effective_policy
from apps.runs.models import Run, RunEvent, RunStatus

KINDS = ("conductor", "chat")
MAX_ROWS = 50_000


@dataclass
class ExportSummary:
    rows: int = 0
    skipped: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "skipped": dict(sorted(self.skipped.items()))}


def _learning_metric(team: Any) -> str:
    spec = effective_policy(team).spec
    learning = getattr(spec, "learning", None)
    return str(getattr(learning, "metric", "") or "helpful")


def _rewards(run_ids: list[Any], metric: str) -> dict[Any, tuple[float, str]]:
    """run id → (reward in [0, 1] or the metric's scale, where it came from)."""
    values: dict[Any, dict[str, list[float]]] = {}
    for run_id, name, optimize, value in Feedback.objects.filter(
        run_id__in=run_ids, metric__name__in=(metric, "review_approved"), step_index__isnull=True
    ).values_list("run_id", "metric__name", "metric__optimize", "value"):
        values.setdefault(run_id, {}).setdefault(name, []).append(-value if optimize == "min" else value)
    out: dict[Any, tuple[float, str]] = {}
    for run_id, by_metric in values.items():
        for name in (metric, "review_approved"):
            got = by_metric.get(name)
            if got:
                out[run_id] = (sum(got) / len(got), f"feedback:{name}")
                break
    return out


def _experiment_scores(run_ids: list[Any]) -> dict[Any, float]:
    return {
        run_id: float(score)
        for run_id, score in ExperimentRun.objects.filter(
            run_id__in=run_ids, score__isnull=False
        ).values_list("run_id", "score")
        if score is not None
    }


def _input_masked(events: list[tuple[str, Any]]) -> bool:
    for kind, data in events:
        if kind == "guardrail.checked" and isinstance(data, dict) and data.get("stage") == "input":
            for check in data.get("checks") or []:
                if (
                    isinstance(check, dict)
                    and check.get("status") == "intervened"
                    and check.get("action") == "redact"
                ):
                    return True
    return False


def _first_plan(events: list[tuple[str, Any]]) -> tuple[list[dict[str, Any]] | None, dict[str, Any] | None]:
    """Round 1's conductor prompt and the plan it wrote that the run executed."""
    prompt: list[dict[str, Any]] | None = None
    proposed: dict[str, Any] | None = None
    for kind, data in events:
        if not isinstance(data, dict) or data.get("round") != 1:
            continue
        if kind == "plan.started" and isinstance(data.get("messages"), list):
            prompt = data["messages"]
        elif kind == "plan.proposed" and data.get("source") == "conductor" and data.get("plan"):
            proposed = data
    return prompt, proposed


def export_rows(
    *, team: Any, kind: str, summary: ExportSummary, limit: int = MAX_ROWS
) -> Iterator[dict[str, Any]]:
    """The export's JSON objects, newest runs first; ``summary`` counts rows and skips."""
    if kind not in KINDS:
        raise ValueError(f"kind: one of {', '.join(KINDS)}")
    metric = _learning_metric(team)
    runs = Run.objects.filter(team=team).order_by("-created_at")
    page_size = 500
    offset = 0
    while summary.rows < limit:
        page = list(runs[offset : offset + page_size])
        if not page:
            return
        offset += page_size
        ids = [r.pk for r in page]
        rewards = _rewards(ids, metric)
        scores = _experiment_scores(ids)
        events: dict[Any, list[tuple[str, Any]]] = {}
        for run_id, ev_kind, data in (
            RunEvent.objects.filter(
                run_id__in=ids, type__in=("plan.started", "plan.proposed", "guardrail.checked")
            )
            .order_by("run_id", "seq")
            .values_list("run_id", "type", "data")
        ):
            events.setdefault(run_id, []).append((ev_kind, data))
        for run in page:
            why = _excluded(run)
            if why:
                summary.skipped[why] += 1
                continue
            reward = rewards.get(run.pk)
            if reward is None and run.pk in scores:
                reward = (scores[run.pk], "experiment")
            row = (
                _conductor_row(run, events.get(run.pk, []), reward)
                if kind == "conductor"
                else _chat_row(run, events.get(run.pk, []), reward)
            )
            if isinstance(row, str):
                summary.skipped[row] += 1
                continue
            summary.rows += 1
            yield row
            if summary.rows >= limit:
                return


def _excluded(run: Run) -> str:
    if run.status != RunStatus.SUCCEEDED:
        return f"not succeeded ({run.status})"
    if run.answer_held:
        return "answer held for review"
    if run.payload_erased_at is not None:
        return "content erased by retention"
    return ""


def _conductor_row(
    run: Run, events: list[tuple[str, Any]], reward: tuple[float, str] | None
) -> dict[str, Any] | str:
    if run.strategy != "conductor":
        return "not a conductor run"
    prompt, proposed = _first_plan(events)
    if prompt is None or proposed is None:
        return "no conductor plan on record"
    if reward is None:
        return "no reward (no feedback, review or experiment score)"
    return {
        "run_id": str(run.pk),
        "preset": run.preset,
        "prompt": prompt,
        "completion": proposed.get("raw") or "",
        "plan": proposed.get("plan"),
        "reward": reward[0],
        "reward_source": reward[1],
        "usage": {"input_tokens": run.input_tokens, "output_tokens": run.output_tokens},
        "cost_usd": str(run.cost_usd) if run.cost_usd is not None else None,
        "policy_version_id": run.policy_version_id,
    }


def _chat_row(
    run: Run, events: list[tuple[str, Any]], reward: tuple[float, str] | None
) -> dict[str, Any] | str:
    # Only answers someone vouched for: an approving review, or a positive reward.
    if not (run.review_status == "approved" or (reward is not None and reward[0] > 0.5)):
        return "answer not approved"
    question = run.question
    if _input_masked(events):
        prompt, _ = _first_plan(events)
        users = [m.get("content") for m in prompt or [] if isinstance(m, dict) and m.get("role") == "user"]
        if not users:
            return "input masked and no masked text on record"
        question = str(users[0])
    return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": run.answer}]}


def dumps(row: dict[str, Any]) -> str:
    return json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n"
