"""ReviewRollup (reviews waiting, approval rate on /insights/) equals counting the Run rows it
replaces, on a seeded set, after reviewer verdicts, and after real runs the sink queued or held."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db.models import Count, Q, Sum
from django.test import Client
from django.utils import timezone

from apps.audit.models import RunReview
from apps.insights import reviews
from apps.insights.models import DAY, HOUR, RUN_ROW, ReviewRollup, Rollup
from apps.insights.rollup import hour_of
from apps.insights.upsert import Bumps
from apps.runs.models import ReviewStatus, Run, RunStatus
from apps.runs.reviews import run_review
from apps.runs.services import run_create, run_wait
from tests.factories.audit import make_run
from tests.factories.governance import SuperuserFactory
from tests.factories.policies import publish_policy
from tests.fixtures.runs import scripted_plan


def _direct(**filters: Any) -> dict[str, Any]:
    """What the page used to compute: Run aggregates (waiting; approval per strategy)."""
    runs = Run.objects.filter(**filters)
    waiting = runs.aggregate(
        pending=Count("pk", filter=Q(review_status=ReviewStatus.PENDING)),
        held=Count("pk", filter=Q(answer_held=True)),
        flagged=Count("pk", filter=Q(review_status=ReviewStatus.FLAGGED)),
    )
    approval = {}
    for r in runs.values("strategy").annotate(
        a=Count("pk", filter=Q(review_status=ReviewStatus.APPROVED)),
        d=Count("pk", filter=Q(review_status__in=[ReviewStatus.APPROVED, ReviewStatus.FLAGGED])),
    ):
        approval[r["strategy"]] = round(100 * r["a"] / r["d"], 1) if r["d"] else None
    return {"waiting": waiting, "approval": approval}


def _direct_reviews(**filters: Any) -> dict[str, Any]:
    """What the page used to compute from RunReview joined to Run: per reviewer and status, and
    the median sign-off wait of the newest 5,000 reviews of finished runs."""
    reviews = RunReview.objects.filter(**filters)
    per = {
        (r["reviewer_label"], r["status"]): r["n"]
        for r in reviews.values("reviewer_label", "status").annotate(n=Count("pk"))
    }
    signed = reviews.filter(run__finished_at__isnull=False).values_list("created_at", "run__finished_at")
    waits = sorted((a - b).total_seconds() for a, b in signed[:5000])
    return {"per": per, "p50": waits[len(waits) // 2] if waits else None, "n": len(waits)}


def _page_reviews(user: Any, **params: str) -> dict[str, Any]:
    client = Client()
    client.force_login(user)
    data = client.get("/insights/", params).context["data"]
    chart = next(c for c in data["charts"] if c["id"] == "reviews")
    per = {
        (name, trace["name"]): n
        for trace in chart["data"]
        for name, n in zip(trace["x"], trace["y"], strict=True)
        if n
    }
    summary = data["reviews"]
    return {"per": per, "p50": summary["signoff_p50_s"], "n": summary["signoff_count"]}


def _page(user: Any, **params: str) -> dict[str, Any]:
    client = Client()
    client.force_login(user)
    resp = client.get("/insights/", params)
    assert resp.status_code == 200
    data = resp.context["data"]
    waiting = {k: data["reviews"][k] for k in ("pending", "held", "flagged")}
    return {
        "waiting": waiting,
        "approval": {row["strategy"]: row["approval_rate"] for row in data["strategies"]},
    }


def _snapshot() -> set[tuple[Any, ...]]:
    fields = ("team_id", "pool_id", "strategy", "grain", "hour", "pending", "held", "flagged", "approved")
    return {
        tuple(r[f] for f in fields)
        for r in ReviewRollup.objects.values(*fields)
        if r["pending"] or r["held"] or r["flagged"] or r["approved"]
    }


def _rebuilt() -> tuple[set[tuple[Any, ...]], set[tuple[Any, ...]]]:
    """The rows the observers kept, and the rows a recount from Run gives."""
    kept = _snapshot()
    reviews.rebuild(Run, ReviewRollup)
    return kept, _snapshot()


def _seed(alpha: Any, beta: Any) -> list[Run]:
    states = [
        ("conductor", ReviewStatus.PENDING, True),
        ("conductor", ReviewStatus.PENDING, False),
        ("conductor", ReviewStatus.APPROVED, False),
        ("conductor", ReviewStatus.FLAGGED, False),
        ("conductor", ReviewStatus.NONE, False),
        ("single", ReviewStatus.APPROVED, False),
        ("single", ReviewStatus.NEEDS_FOLLOW_UP, False),
        ("moa", ReviewStatus.PENDING, False),
    ]
    runs = []
    for team in (alpha, beta):
        for strategy, status, held in states:
            run = make_run(
                team,
                strategy=strategy,
                review_status=status,
                answer_held=held,
                finished_at=timezone.now() - timedelta(minutes=len(runs) + 1),
            )
            runs.append(run)
            # The run-level rollup row its run.finished would have added (the strategy table
            # lists the strategies that ran).
            bumps = Bumps()
            bumps.add(
                Rollup,
                {"team_id": team.pk, "pool_id": run.pool_id, "strategy": strategy, "worker_key": RUN_ROW,
                 "hour": hour_of(run.created_at.timestamp())},
                runs=1,
            )  # fmt: skip
            bumps.flush()
    return runs


@pytest.mark.django_db
def test_review_rollups_equal_run_aggregates_and_follow_verdicts(
    alpha: Any, beta: Any, reviewer: Any, outsider: Any
) -> None:
    runs = _seed(alpha, beta)
    admin = SuperuserFactory(username="platform")
    for rng in ("24h", "7d"):
        assert _page(admin, range=rng) == _direct()
        assert _page(admin, range=rng, team="alpha") == _direct(team=alpha)
    assert _page(admin)["waiting"] == {"pending": 6, "held": 2, "flagged": 2}
    assert _page(admin)["approval"] == {"conductor": 50.0, "single": 100.0, "moa": None}

    # Verdicts move runs between the counters: a held pending run approved (answer released), a
    # pending one flagged, an approved one flagged, a flagged one sent to follow-up.
    alpha_runs = [r for r in runs if r.team_id == alpha.pk]
    run_review(actor=reviewer, run=alpha_runs[0], status="approved")
    run_review(actor=reviewer, run=alpha_runs[1], status="flagged", reason="wrong")
    run_review(actor=reviewer, run=alpha_runs[2], status="flagged", reason="on second look")
    run_review(actor=reviewer, run=alpha_runs[3], status="needs_follow_up")
    assert Run.objects.get(pk=alpha_runs[0].pk).answer_held is False
    for rng in ("24h", "30d"):
        assert _page(admin, range=rng) == _direct()
        assert _page(admin, range=rng, team="alpha") == _direct(team=alpha)
    assert _page(admin, team="alpha")["waiting"] == {"pending": 1, "held": 0, "flagged": 2}
    assert _page(admin, team="alpha")["approval"] == {"conductor": 33.3, "single": 100.0, "moa": None}

    # A member of beta sees beta's counts only.
    assert _page(outsider) == _direct(team=beta)
    # The reviews chart (from ReviewFact) equals counting RunReview joined to its runs.
    assert _page_reviews(admin) == _direct_reviews()
    assert _page_reviews(admin, team="alpha") == _direct_reviews(run__team=alpha)
    assert _page_reviews(outsider) == _direct_reviews(run__team=beta)
    assert _page_reviews(admin)["per"] == {
        ("reviewer", "approved"): 1,
        ("reviewer", "flagged"): 2,
        ("reviewer", "needs_follow_up"): 1,
    }
    assert _page_reviews(admin)["n"] == 4 and _page_reviews(admin)["p50"] > 0
    # A run reviewed while it still ran: its wait counts once it has ended.
    running = make_run(alpha, status=RunStatus.RUNNING, answer="")
    run_review(actor=reviewer, run=running, status="flagged", reason="early")
    assert _page_reviews(admin) == _direct_reviews() and _page_reviews(admin)["n"] == 4
    Run.objects.filter(pk=running.pk).update(finished_at=timezone.now(), status=RunStatus.SUCCEEDED)
    assert _page_reviews(admin) == _direct_reviews() and _page_reviews(admin)["n"] == 5
    kept, rebuilt = _rebuilt()
    assert kept == rebuilt and {r[3] for r in kept} == {HOUR, DAY}


@pytest.mark.django_db
def test_a_save_that_leaves_the_review_state_alone_changes_nothing(alpha: Any) -> None:
    run = make_run(alpha, review_status=ReviewStatus.PENDING)
    before = _snapshot()
    run.question = "edited"
    run.save()  # a full save: the state is read and compared, nothing moves
    run.status = RunStatus.FAILED
    run.save(update_fields=["status"])  # not a review field: not even read
    assert _snapshot() == before
    assert ReviewRollup.objects.filter(grain=HOUR).aggregate(p=Sum("pending"))["p"] == 1


@pytest.mark.runtime
@pytest.mark.django_db(transaction=True)
def test_runs_the_sink_queues_or_holds_are_counted(
    runtime_workers: Any, fake_pool: Any, owner: Any, alpha: Any, reviewer: Any
) -> None:
    """The sink's run end holds an answer and queues the run for review (require_review guardrail)
    with queryset updates: the observer counts both; a verdict then moves them."""
    scripted_plan(fake_pool.server)
    publish_policy(alpha, {"guardrails": {"input": {"pii": {"enabled": True, "action": "require_review"}}}})
    ids = [
        run_create(actor=owner, pool=fake_pool.pool, question=question, strategy="single").id
        for question in ("Write to jane.doe@example.com please?", "What is 2+2?")
    ]
    finished = [run_wait(i, 60) for i in ids]
    assert [r.status for r in finished] == [RunStatus.SUCCEEDED] * 2, [(r.status, r.error) for r in finished]
    assert [r.answer_held for r in finished] == [True, False]
    assert [r.review_status for r in finished] == [ReviewStatus.PENDING, ReviewStatus.NONE]
    admin = SuperuserFactory(username="platform")
    assert _page(admin) == _direct()
    assert _page(admin)["waiting"] == {"pending": 1, "held": 1, "flagged": 0}

    run_review(actor=reviewer, run=finished[0], status="approved")
    run_review(actor=reviewer, run=finished[1], status="flagged", reason="checked anyway")
    assert _page(admin) == _direct()
    assert _page(admin)["waiting"] == {"pending": 0, "held": 0, "flagged": 1}
    assert _page(admin)["approval"] == {"single": 50.0}
    kept, rebuilt = _rebuilt()
    assert kept == rebuilt
    assert _page_reviews(admin) == _direct_reviews()
    assert _page_reviews(admin)["per"] == {("reviewer", "approved"): 1, ("reviewer", "flagged"): 1}
