"""Keeps ``ReviewRollup`` equal to counting ``Run`` rows by review state, per creation bucket.

A run's review state (``review_status``, ``answer_held``) changes in two places, and each is
followed here without touching the code that changes it:

- at run end, inside the sink's ``run.finished`` handling (a queryset update: no model signal):
  the sink may hold the answer and ``apps.audit.services.review_request`` may queue the run
  (``none`` -> ``pending``, its only transition). The in-transaction rollup observer reads the run
  after that and calls :func:`at_run_end`. Both states are only ever *entered* there, so the run's
  earlier state contributed no ``pending`` and no ``held``;
- a reviewer's verdict (``apps.audit.services.run_review`` saves the locked run with
  ``update_fields``) and any other ``Run.save()``: the ``pre_save``/``post_save`` signals below
  take the state before and after and move the run between counters, in the save's transaction.

``rebuild`` recounts everything from ``Run`` (the migration's backfill; a repair tool).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.db.models import Count, Q
from django.db.models.functions import TruncDay, TruncHour

from apps.insights.models import DAY, HOUR, ReviewFact, ReviewRollup
from apps.insights.upsert import Bumps
from apps.runs.models import Run

PENDING, FLAGGED, APPROVED = "pending", "flagged", "approved"  # apps.runs.models.ReviewStatus
_WATCHED = frozenset({"review_status", "answer_held"})
_BEFORE = "_insights_review_before"


def counts(status: str, held: bool) -> dict[str, int]:
    """The counters one run in this state adds to its bucket."""
    out = {"pending": int(status == PENDING), "flagged": int(status == FLAGGED)}
    out["approved"] = int(status == APPROVED)
    out["held"] = int(bool(held))
    return out


def _bucket(created_at: datetime) -> datetime:
    return created_at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def _key(team_id: int, pool_id: int | None, strategy: str, created_at: datetime) -> dict[str, Any]:
    return {"team_id": team_id, "pool_id": pool_id, "strategy": strategy, "hour": _bucket(created_at)}


def at_run_end(bumps: Bumps, base: dict[str, Any], run: dict[str, Any]) -> None:
    """The run has just ended (its row as the sink left it): count what the end entered."""

    entered = {"pending": int(run["review_status"] == PENDING), "held": int(bool(run["answer_held"]))}
    bumps.add(ReviewRollup, {**base, "hour": _bucket(run["created_at"])}, **entered)


def on_run_pre_save(sender: Any, instance: Any, update_fields: Any = None, **kwargs: Any) -> None:
    """Remember the stored review state of a run about to be saved with a new one."""
    if instance._state.adding or (update_fields is not None and not _WATCHED & set(update_fields)):
        return
    stored = type(instance).objects.filter(pk=instance.pk).values_list("review_status", "answer_held").first()
    setattr(instance, _BEFORE, stored)


def on_run_post_save(
    sender: Any, instance: Any, created: bool = False, update_fields: Any = None, **kwargs: Any
) -> None:
    """Move the run between counters when a save changed its review state."""

    if created:
        before: tuple[str, bool] | None = ("", False)
    else:
        before = instance.__dict__.pop(_BEFORE, None)
    if before is None:
        return  # not a save of the review state (or a row that was not stored)
    old, new = counts(*before), counts(instance.review_status, instance.answer_held)
    delta = {name: new[name] - old[name] for name in new}
    if not any(delta.values()):
        return
    bumps = Bumps()
    bumps.add(
        ReviewRollup,
        _key(instance.team_id, instance.pool_id, instance.strategy, instance.created_at),
        **delta,
    )
    bumps.flush()


def on_review_saved(sender: Any, instance: Any, created: bool = False, **kwargs: Any) -> None:
    """A new RunReview: its row for the reviews chart, in the review's transaction."""

    if not created:
        return  # a review's run, reviewer, status and time never change after it is written
    run = instance._state.fields_cache.get("run")  # the locked run the review was made on
    if run is not None:
        team_id, finished_at = run.team_id, run.finished_at
    else:
        team_id, finished_at = Run.objects.filter(pk=instance.run_id).values_list("team_id", "finished_at")[0]
    ReviewFact.objects.create(
        review_id=instance.pk,
        team_id=team_id,
        run_id=instance.run_id,
        reviewer_label=instance.reviewer_label,
        status=instance.status,
        created_at=instance.created_at,
        run_finished_at=finished_at,
    )


def rebuild_facts(review_model: Any, fact_model: Any) -> int:
    """One fact per review (models passed in so a migration can use its own)."""
    fact_model.objects.all().delete()
    made = [
        fact_model(
            review_id=pk,
            team_id=team_id,
            run_id=run_id,
            reviewer_label=label,
            status=status,
            created_at=created_at,
            run_finished_at=finished_at,
        )
        for pk, team_id, run_id, label, status, created_at, finished_at in review_model.objects.values_list(
            "pk", "run__team_id", "run_id", "reviewer_label", "status", "created_at", "run__finished_at"
        )
        .order_by()
        .iterator()
    ]
    fact_model.objects.bulk_create(made, batch_size=1000)
    return len(made)


def rebuild(run_model: Any, rollup_model: Any) -> int:
    """Recount every bucket from the runs (models passed in so a migration can use its own)."""
    rollup_model.objects.all().delete()
    made = []
    for grain, trunc in ((HOUR, TruncHour), (DAY, TruncDay)):
        rows = (
            run_model.objects.annotate(bucket=trunc("created_at", tzinfo=UTC))
            .values("team_id", "pool_id", "strategy", "bucket")
            .annotate(
                pending=Count("pk", filter=Q(review_status=PENDING)),
                flagged=Count("pk", filter=Q(review_status=FLAGGED)),
                approved=Count("pk", filter=Q(review_status=APPROVED)),
                held=Count("pk", filter=Q(answer_held=True)),
            )
            .order_by()
        )
        for row in rows.iterator():
            if row["pending"] or row["flagged"] or row["approved"] or row["held"]:
                made.append(
                    rollup_model(
                        team_id=row["team_id"],
                        pool_id=row["pool_id"],
                        strategy=row["strategy"],
                        grain=grain,
                        hour=row["bucket"],
                        pending=row["pending"],
                        flagged=row["flagged"],
                        approved=row["approved"],
                        held=row["held"],
                    )
                )
    rollup_model.objects.bulk_create(made, batch_size=1000)
    return len(made)
