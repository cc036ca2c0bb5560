"""Writes for evaluation sets and experiments (HackSoft style: keyword-only, one transaction each).

An experiment creates ALL its runs up front in one transaction: each queues in the run outbox and
the executors' own concurrency (the in-process pool, or Celery workers when distributed) bounds
how many are in flight. A run is scored when it finishes, by an after-commit run observer
(`on_run_event`); ``experiment_refresh`` scores whatever the observer could not see (runs
cancelled in the queue, a process that died) so progress never sticks. Scoring is a conditional
update, so the observer and a refresh may race without scoring twice.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from apps.audit.events import AuditEventType
from apps.audit.services import audit_record
from apps.core.types import Actor, stored_user
from apps.experiments.datasets import ParsedItem
from apps.experiments.export import KINDS, ExportSummary, dumps, export_rows
from apps.experiments.models import (
    Dataset,
    DatasetItem,
    EvaluatorKind,
    Experiment,
    ExperimentRun,
    ExperimentStatus,
)
from apps.feedback.evaluators import JUDGE_TIMEOUT_S, Outcome, evaluate_exact, evaluate_regex, judge_score
from apps.governance import selectors as gov
from apps.governance.models import Team
from apps.learning.bandit import Arm
from apps.learning.services import OfflineExample, learn_offline
from apps.runs.integration import policy_in_force
from apps.runs.models import Run, RunSource
from apps.runs.services import RunRefused, run_cancel, run_create
from apps.workers.engine_adapter import preset_conductor_of
from apps.workers.grants import pools_granted_to
from apps.workers.models import PRESET_CONDUCTOR_FIELDS, Pool

logger = logging.getLogger(__name__)

RUN_PERMISSION = "governance.run_on_team"
TEACH_PERMISSION = "governance.manage_team"
COMPOSITE_ARMS = ("moa", "pev", "conductor-mini", "conductor-ultra", "learned")
MAX_RUNS_PER_EXPERIMENT = 5_000
TERMINAL_RUN = ("succeeded", "failed", "blocked", "cancelled", "timed_out")
JUDGING = "judging"  # the LLM judge is grading the row's answer (claimed, not yet scored)
HELD = "held"  # an experiment row whose run's answer is held for review: not scored (issue 39)


class ExperimentError(ValueError):
    """A refusal the user can act on; ``field`` names the form field when there is one."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        self.field = field
        super().__init__(message)


def _require_run_on_team(actor: Actor, team: Team) -> None:
    if not gov.can_run_on_team(actor, team):
        raise PermissionError(
            f"You may not run experiments for team '{team.slug}': it needs {RUN_PERMISSION}."
        )


# --- datasets ------------------------------------------------------------------------------------


def dataset_upload(*, actor: Actor, team: Team, name: str, items: list[ParsedItem]) -> Dataset:
    """Store a parsed (already validated, see ``datasets.parse_jsonl``) evaluation set."""
    _require_run_on_team(actor, team)
    name = (name or "").strip()
    if not name:
        raise ExperimentError("Give the dataset a name.", field="name")
    if not items:
        raise ExperimentError("The dataset has no items.", field="file")
    with transaction.atomic():
        dataset = Dataset.objects.create(
            team=team, name=name[:120], created_by=stored_user(actor), row_count=len(items)
        )
        DatasetItem.objects.bulk_create(
            DatasetItem(
                dataset=dataset, index=it.index, messages=it.messages, reference=it.reference, tags=it.tags
            )
            for it in items
        )
        tags = sorted({t for it in items for t in it.tags})
        audit_record(
            event_type=AuditEventType.DATASET_UPLOADED,
            actor=actor,
            team=team,
            obj=dataset,
            object_repr=str(dataset)[:200],
            payload={
                "name": dataset.name,
                "rows": len(items),
                "with_reference": sum(1 for it in items if it.reference is not None),
                "tags": tags[:50],
            },
        )
    return dataset


# --- experiments ---------------------------------------------------------------------------------


def arm_choices(pool: Pool) -> list[str]:
    """The strategies an experiment on ``pool`` may compare: each single worker, then the rest."""
    singles = [f"single:{pw.worker.slug}" for pw in pool.pool_workers.select_related("worker")]
    return singles + list(COMPOSITE_ARMS)


def _run_kwargs(arm: str, pool: Pool) -> dict[str, Any]:
    if arm.startswith("single:"):
        slug = arm.removeprefix("single:")
        pw = pool.pool_workers.select_related("worker").filter(worker__slug=slug).first()
        if pw is None:
            raise ExperimentError(f"The worker '{slug}' is not in the pool '{pool.slug}'.", field="arms")
        return {"strategy": "single", "worker": pw.worker}
    if arm in ("conductor-mini", "conductor-ultra"):
        return {"strategy": "conductor", "preset": arm.removeprefix("conductor-")}
    if arm in ("moa", "pev", "learned"):
        return {"strategy": arm}
    raise ExperimentError(f"Unknown arm '{arm}'.", field="arms")


def _models_of(pool: Pool) -> dict[str, Any]:
    workers = {pw.worker.slug: pw.worker.model_name for pw in pool.pool_workers.select_related("worker")}
    conductor = pool.conductor_worker
    # Each preset's planner as it was (its own conductor, else the pool's), for a faithful re-run.
    presets: dict[str, Any] = {}
    for preset in PRESET_CONDUCTOR_FIELDS:
        planner = preset_conductor_of(pool, preset)
        presets[f"conductor-{preset}"] = (
            {"worker": planner.slug, "model": planner.model_name} if planner is not None else None
        )
    return {
        "workers": workers,
        "conductor": conductor.model_name if conductor else None,
        "preset_conductors": presets,
    }


def experiment_start(
    *,
    actor: Actor,
    dataset: Dataset,
    pool: Pool,
    arms: list[str],
    evaluator: str = EvaluatorKind.EXACT,
    seed: int = 0,
    judge_pool: Pool | None = None,
    judge_worker: str = "",
    rubric: str = "",
) -> Experiment:
    """Create the experiment and every (item, arm) run in one transaction; they dispatch on commit.

    ``evaluator="judge"``: ``judge_worker`` of ``judge_pool`` (a pool of the team the actor may
    use) grades every answer against ``rubric``; its calls pass the team's outbound gate."""

    team = dataset.team
    _require_run_on_team(actor, team)
    if not Pool.objects.visible_to(actor, "use").filter(pk=pool.pk).exists():
        raise ExperimentError(f"You may not run on the pool '{pool.slug}' (it needs use_pool).", field="pool")
    arms = list(dict.fromkeys(a for a in arms if a))
    if not arms:
        raise ExperimentError("Pick at least one strategy to compare.", field="arms")
    allowed = arm_choices(pool)
    bad = [a for a in arms if a not in allowed]
    if bad:
        raise ExperimentError(
            f"'{bad[0]}' is not a strategy of the pool '{pool.slug}' (choose from {', '.join(allowed)}).",
            field="arms",
        )
    if evaluator not in EvaluatorKind.values:
        raise ExperimentError(
            f"Unknown evaluator '{evaluator}'; choose {', '.join(EvaluatorKind.values)}.", field="evaluator"
        )
    if evaluator == EvaluatorKind.JUDGE:
        _check_judge(actor=actor, team=team, pool=judge_pool, worker=judge_worker, rubric=rubric)
    else:
        judge_pool, judge_worker, rubric = None, "", ""
    items = list(dataset.items.all())
    if len(items) * len(arms) > MAX_RUNS_PER_EXPERIMENT:
        raise ExperimentError(
            f"{len(items)} questions times {len(arms)} strategies is more than {MAX_RUNS_PER_EXPERIMENT:,} runs.",
            field="arms",
        )
    # The seed fixes the order the runs are queued in (and is recorded for a re-run).
    pairs = [(item, arm) for item in items for arm in arms]
    random.Random(seed).shuffle(pairs)
    now = timezone.now()
    with transaction.atomic():
        experiment = Experiment.objects.create(
            team=team,
            dataset=dataset,
            pool=pool,
            arms=arms,
            evaluator=evaluator,
            judge_pool=judge_pool,
            judge_worker=judge_worker,
            rubric=rubric.strip(),
            seed=seed,
            policy_version_id_at_start=policy_in_force(team).version_id,
            models_at_start=_models_of(pool),
            status=ExperimentStatus.RUNNING,
            created_by=stored_user(actor),
            started_at=now,
        )
        rows: list[ExperimentRun] = []
        for item, arm in pairs:
            try:
                run = run_create(
                    actor=actor,
                    team=team,
                    pool=pool,
                    question=item.question,
                    source=RunSource.REST_API,
                    # Team evaluators read the reference from here too (apps.feedback.evaluators).
                    api_request={
                        "metadata": {
                            "experiment": experiment.pk,
                            "item": item.index,
                            "arm": arm,
                            **({"reference": item.reference} if item.reference else {}),
                        }
                    },
                    **_run_kwargs(arm, pool),
                )
            except RunRefused as err:
                # Nothing of the experiment is kept: a half-started experiment compares nothing.
                raise ExperimentError(
                    f"The run for line {item.index} ({arm}) was refused: {err.message}"
                ) from None
            rows.append(ExperimentRun(experiment=experiment, item=item, arm=arm, run=run))
        ExperimentRun.objects.bulk_create(rows)
        audit_record(
            event_type=AuditEventType.EXPERIMENT_STARTED,
            actor=actor,
            team=team,
            obj=experiment,
            object_repr=str(experiment)[:200],
            policy_version_id=experiment.policy_version_id_at_start,
            payload={
                "dataset": dataset.pk,
                "pool": pool.slug,
                "arms": arms,
                "evaluator": evaluator,
                **(
                    {"judge": f"{judge_pool.slug}/{judge_worker}", "rubric_chars": len(rubric.strip())}
                    if judge_pool is not None
                    else {}
                ),
                "seed": seed,
                "runs": len(rows),
                "models": experiment.models_at_start,
            },
        )
    return experiment


def _check_judge(*, actor: Actor, team: Team, pool: Pool | None, worker: str, rubric: str) -> None:
    if pool is None or not worker:
        raise ExperimentError("The LLM judge needs a judge worker.", field="judge")
    usable = Pool.objects.visible_to(actor, "use").filter(pk=pool.pk, enabled=True).exists()
    if not usable or not pools_granted_to(team).filter(pk=pool.pk).exists():
        raise ExperimentError(
            f"The judge's pool '{pool.slug}' is not one of team '{team.slug}' you may use (use_pool).",
            field="judge",
        )
    if not pool.pool_workers.filter(worker__slug=worker).exists():
        raise ExperimentError(f"The worker '{worker}' is not in the pool '{pool.slug}'.", field="judge")
    if not rubric.strip():
        raise ExperimentError("The LLM judge needs a rubric: what a good answer does.", field="rubric")


def score_answer(evaluator: str, answer: str, reference: str | None) -> float | None:
    if evaluator == EvaluatorKind.REGEX:
        return evaluate_regex(answer, reference).value
    return evaluate_exact(answer, reference, {"normalize": True}).value


def _judge(er: ExperimentRun, run: Run) -> Outcome:
    experiment = er.experiment
    if experiment.judge_pool is None:
        return Outcome(None, "no judge worker was chosen")
    try:
        outcome = judge_score(
            team=experiment.team,
            pool=experiment.judge_pool,
            worker_slug=experiment.judge_worker,
            question=er.item.question,
            answer=run.answer or "",
            rubric=experiment.rubric,
            reference=er.item.reference,
            run_id=run.pk,
            purpose="experiment judge",
        )
    except Exception as exc:  # a broken judge scores nothing; the row says why
        logger.warning("experiment %s: judge failed on run %s: %s", experiment.pk, run.pk, exc)
        return Outcome(None, f"the judge failed ({type(exc).__name__})")
    return outcome if outcome.value is None else Outcome(outcome.value, f"judge score {outcome.value:g}")


def _score(er: ExperimentRun, run: Run) -> bool:
    """Record a finished run's outcome on its row; False when someone else already did.

    A held answer is not scored (issue 39): a score compares the answer with a reference the
    experimenter wrote, so it would tell a member the held answer one guess per dataset row. The
    row says ``held``; ``experiment_refresh`` scores it once a reviewer releases the answer. The
    LLM judge never sees a held answer either."""
    held = run.status == "succeeded" and bool(getattr(run, "answer_held", False))
    succeeded = run.status == "succeeded" and not held
    judged = succeeded and er.experiment.evaluator == EvaluatorKind.JUDGE
    unscored = Q(scored_at__isnull=True) | Q(status=HELD)
    note = ""
    if judged:
        # A judge call costs money: the row is claimed first so the observer and a page refresh
        # never both ask (a claim older than the judge's timeout is taken over, see refresh).
        if (
            not ExperimentRun.objects.filter(unscored, pk=er.pk)
            .exclude(status=JUDGING)
            .update(status=JUDGING, judging_since=timezone.now())
        ):
            return False
        unscored = Q(status=JUDGING)
        outcome = _judge(er, run)
        score, note = outcome.value, outcome.note
    elif succeeded:
        score = score_answer(er.experiment.evaluator, run.answer or "", er.item.reference)
    else:
        score = None
    if (
        run.status != "succeeded"
        and run.status != "cancelled"
        and (er.item.reference is not None or er.experiment.evaluator == EvaluatorKind.JUDGE)
    ):
        # A failed, blocked or timed-out run answered nothing: wrong, not unknown. A cancelled
        # one was never allowed to answer, so it does not count against its strategy.
        score = 0.0
    if held:
        note = "held for review: not scored until a reviewer releases it"
    tokens = (run.input_tokens or 0) + (run.output_tokens or 0)
    # Claimed once; a held row again once its answer is released (then it gets its score).
    updated = ExperimentRun.objects.filter(unscored, pk=er.pk).update(
        status=HELD if held else run.status,
        score=score,
        score_note=note[:200],
        cost_usd=run.cost_usd if run.priced else None,
        tokens=tokens,
        latency_ms=run.latency_ms,
        scored_at=timezone.now(),
    )
    return updated == 1


def _maybe_finish(experiment_id: int) -> None:
    """When every run is scored, the experiment ends (once: a conditional update claims it)."""
    if ExperimentRun.objects.filter(experiment_id=experiment_id, scored_at__isnull=True).exists():
        return
    rows = ExperimentRun.objects.filter(experiment_id=experiment_id)
    status = (
        ExperimentStatus.SUCCEEDED
        if rows.filter(status__in=("succeeded", HELD)).exists()
        else ExperimentStatus.FAILED
    )
    with transaction.atomic():
        claimed = Experiment.objects.filter(pk=experiment_id, status=ExperimentStatus.RUNNING).update(
            status=status, finished_at=timezone.now()
        )
        if claimed != 1:
            return
        experiment = Experiment.objects.select_related("team").get(pk=experiment_id)
        audit_record(
            event_type=AuditEventType.EXPERIMENT_FINISHED,
            team=experiment.team,
            obj=experiment,
            object_repr=str(experiment)[:200],
            payload={
                "status": status,
                "runs": rows.count(),
                "succeeded": rows.filter(status="succeeded").count(),
            },
        )


def on_run_event(view: Any) -> None:
    """After-commit run observer: score the experiment row of a run that just finished."""
    if view.type != "run.finished":
        return
    # An experiment's runs carry its id in their metadata (experiment_start); other runs need no
    # read. A run the observer misses is still scored by experiment_refresh.
    if view.metadata is not None and "experiment" not in view.metadata:
        return
    er = (
        ExperimentRun.objects.select_related("experiment", "item", "run")
        .filter(run_id=view.run_id, scored_at__isnull=True)
        .first()
    )
    if er is None or er.run is None:
        return
    if _score(er, er.run):
        _maybe_finish(er.experiment_id)


def experiment_refresh(experiment: Experiment) -> None:
    """Score finished runs the observer did not (cancelled in the queue, erased, lost); idempotent."""
    # Only rows whose run ended (or vanished): the page polls this every second.
    stale = timezone.now() - timedelta(seconds=3 * JUDGE_TIMEOUT_S)
    pending = (
        ExperimentRun.objects.select_related("experiment", "item", "run")
        .filter(experiment=experiment, scored_at__isnull=True)
        .filter(Q(run__isnull=True) | Q(run__status__in=TERMINAL_RUN))
        # a judge at work is left alone, unless its claim outlived the judge's timeout (a crash)
        .exclude(status=JUDGING, judging_since__gte=stale)
    )
    released = ExperimentRun.objects.select_related("experiment", "item", "run").filter(
        experiment=experiment, status=HELD, run__answer_held=False
    )
    for er in [*pending, *released]:
        if er.run is None:  # the run was deleted (retention): count it as failed
            ExperimentRun.objects.filter(pk=er.pk, scored_at__isnull=True).update(
                status="failed", scored_at=timezone.now()
            )
        elif er.run.status in TERMINAL_RUN:
            if er.status == JUDGING:  # a crashed judge's claim: release it to be judged again
                ExperimentRun.objects.filter(pk=er.pk, status=JUDGING, judging_since__lt=stale).update(
                    status=""
                )
            _score(er, er.run)
    if experiment.status == ExperimentStatus.RUNNING:
        _maybe_finish(experiment.pk)


def experiment_cancel(*, actor: Actor, experiment: Experiment) -> Experiment:
    """Cancel every unfinished run and mark the experiment cancelled (finished runs keep their scores)."""

    _require_run_on_team(actor, experiment.team)
    if experiment.is_terminal:
        return experiment
    run_ids = list(
        ExperimentRun.objects.filter(
            experiment=experiment, scored_at__isnull=True, run__isnull=False
        ).values_list("run_id", flat=True)
    )
    cancelled = 0
    for run in Run.objects.filter(pk__in=run_ids).exclude(status__in=TERMINAL_RUN):
        run_cancel(actor=actor, run=run)
        cancelled += 1
    with transaction.atomic():
        claimed = Experiment.objects.filter(pk=experiment.pk, status=ExperimentStatus.RUNNING).update(
            status=ExperimentStatus.CANCELLED, finished_at=timezone.now()
        )
        if claimed == 1:
            audit_record(
                event_type=AuditEventType.EXPERIMENT_CANCELLED,
                actor=actor,
                team=experiment.team,
                obj=experiment,
                object_repr=str(experiment)[:200],
                payload={"runs_cancelled": cancelled},
            )
    experiment.refresh_from_db()
    return experiment


# --- teaching the learned router ------------------------------------------------------------------


def _arm_of(arm_id: str) -> Any:
    if arm_id.startswith("single:"):
        return Arm(arm_id, "single", worker=arm_id.removeprefix("single:"))
    if arm_id.startswith("conductor-"):
        return Arm(arm_id, "conductor", preset=arm_id.removeprefix("conductor-"))
    return Arm(arm_id, arm_id)


@dataclass(frozen=True)
class TeachResult:
    learned: int
    skipped: int


def experiment_teach(*, actor: Actor, experiment: Experiment) -> TeachResult:
    """Teach the team's learned router from the scored rows (learning audits the new version).

    Only rows with a score and an arm the router knows (not ``learned`` itself) count."""

    if not gov.can_manage_team(actor, experiment.team):
        raise PermissionError(
            f"You may not teach team '{experiment.team.slug}''s router: it needs {TEACH_PERMISSION}."
        )
    arms = tuple(_arm_of(a) for a in experiment.arms if a != "learned")
    by_id = {a.id: a for a in arms}
    examples: list[Any] = []
    skipped = 0
    for er in ExperimentRun.objects.select_related("item").filter(experiment=experiment):
        arm = by_id.get(er.arm)
        if arm is None or er.score is None:
            skipped += 1
            continue
        examples.append(
            OfflineExample(
                question=er.item.question,
                arm=arm,
                value=er.score,
                cost_usd=float(er.cost_usd) if er.cost_usd is not None else None,
                latency_ms=er.latency_ms,
                arms=arms,
            )
        )
    if not examples:
        raise ExperimentError("No scored results to learn from (each question needs a reference answer).")
    learned = learn_offline(examples, team_id=experiment.team_id, actor=actor)
    return TeachResult(learned=learned, skipped=skipped)


def training_export(
    *, actor: Actor, team: Team, kind: str, limit: int = 50_000
) -> tuple[list[str], dict[str, Any]]:
    """The team's training export as JSONL lines (apps.experiments.export), audited with its
    counts (never its content). Team admins only: it carries questions and answers."""

    if not gov.can_manage_team(actor, team):
        raise PermissionError(
            f"A training export of team '{team.slug}' needs governance.manage_team (team admin): "
            "it carries the team's questions and answers."
        )
    if kind not in KINDS:
        raise ExperimentError(f"kind: one of {', '.join(KINDS)}.", field="kind")
    summary = ExportSummary()
    lines = [dumps(row) for row in export_rows(team=team, kind=kind, summary=summary, limit=limit)]
    with transaction.atomic():
        audit_record(
            event_type=AuditEventType.TRAINING_EXPORTED,
            actor=actor,
            team=team.pk,
            object_type="governance.team",
            object_id=str(team.pk),
            payload={"kind": kind, **summary.as_dict()},
        )
    return lines, summary.as_dict()
