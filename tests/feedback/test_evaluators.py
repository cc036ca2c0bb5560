"""Automatic evaluators: json_schema / regex / exact_match / judge, run by the after-commit run
observer; held answers are never evaluated; a failing judge records nothing."""

from __future__ import annotations

from typing import Any

import pytest

from apps.audit.models import AuditEvent
from apps.feedback.evaluators import parse_score, run_evaluators
from apps.feedback.models import Evaluator, Feedback, Metric
from apps.runs import observers
from tests.factories.runs import RunFactory
from tests.fakes.base import FakeError, FakeReply


def _finished(run: Any, status: str = "succeeded") -> None:
    """What the sink does after committing ``run.finished``."""
    event = {"type": "run.finished", "seq": 9, "data": {"status": status}}
    observers.notify_after_commit(
        observers.RunEventView(run.pk, run.team_id, None, event, run.pool_id, "conductor")
    )


def _evaluators(alpha: Any) -> Metric:
    correct = Metric.objects.create(team=alpha, name="correct", kind="boolean")
    Evaluator.objects.create(
        team=alpha,
        name="json",
        metric=correct,
        kind="json_schema",
        config={"schema": {"type": "object", "required": ["answer"]}},
    )
    Evaluator.objects.create(team=alpha, name="regex", metric=correct, kind="regex", config={})
    Evaluator.objects.create(team=alpha, name="exact", metric=correct, kind="exact_match", config={})
    Evaluator.objects.create(team=alpha, name="off", metric=correct, kind="exact_match", enabled=False)
    return correct


def _values(run: Any) -> dict[str, float]:
    return dict(Feedback.objects.filter(run=run).values_list("evaluator_name", "value"))


@pytest.mark.django_db
def test_regex_exact_and_json_schema_with_a_reference(fake_pool: Any, owner: Any, alpha: Any) -> None:
    _evaluators(alpha)
    run = RunFactory(
        team=alpha,
        pool=fake_pool.pool,
        created_by=owner,
        status="succeeded",
        answer='{"answer": 42}',
        api_request={"metadata": {"reference": '  {"ANSWER": 42}'}},
    )
    _finished(run)
    assert _values(run) == {"json": 1.0, "regex": 0.0, "exact": 1.0}  # exact normalises case and spaces
    assert set(Feedback.objects.filter(run=run).values_list("source", flat=True)) == {"evaluator"}
    assert AuditEvent.objects.filter(event_type="feedback.recorded", run_id=run.pk).count() == 3

    other = RunFactory(
        team=alpha,
        pool=fake_pool.pool,
        created_by=owner,
        status="succeeded",
        answer="It is 42, I think.",
        api_request={"metadata": {"reference": r"\b42\b"}},
    )
    _finished(other)
    assert _values(other) == {"json": 0.0, "regex": 1.0, "exact": 0.0}


@pytest.mark.django_db
def test_no_reference_skips_regex_and_exact(fake_pool: Any, owner: Any, alpha: Any) -> None:
    _evaluators(alpha)
    run = RunFactory(team=alpha, pool=fake_pool.pool, created_by=owner, status="succeeded", answer="{}")
    _finished(run)
    assert _values(run) == {"json": 0.0}  # {} lacks the required "answer"


@pytest.mark.django_db
def test_held_failed_and_unfinished_runs_are_not_evaluated(fake_pool: Any, owner: Any, alpha: Any) -> None:
    _evaluators(alpha)
    held = RunFactory(
        team=alpha,
        pool=fake_pool.pool,
        created_by=owner,
        status="succeeded",
        answer="{}",
        answer_held=True,
        api_request={"metadata": {"reference": "{}"}},
    )
    _finished(held)
    failed = RunFactory(team=alpha, pool=fake_pool.pool, created_by=owner, status="failed", answer="")
    _finished(failed, status="failed")
    assert run_evaluators(failed.pk) == []
    assert not Feedback.objects.exists()


@pytest.mark.django_db
def test_judge_scores_with_a_pool_worker(fake_pool: Any, owner: Any, alpha: Any) -> None:
    quality = Metric.objects.create(team=alpha, name="quality", kind="float")
    Evaluator.objects.create(
        team=alpha,
        name="judge",
        metric=quality,
        kind="judge",
        config={"rubric": "Gives the number.", "worker": "fake-critic"},
    )
    fake_pool.server.responder = lambda req: FakeReply("The answer is right.\nSCORE: 0.75")
    run = RunFactory(
        team=alpha,
        pool=fake_pool.pool,
        created_by=owner,
        status="succeeded",
        question="6*7?",
        answer="42",
        api_request={"metadata": {"reference": "42"}},
    )
    _finished(run)
    assert _values(run) == {"judge": 0.75}
    sent = fake_pool.server.chat_requests()[-1]
    assert sent.json["model"] == "fake-critic-1"
    text = "\n".join(m["content"] for m in sent.messages)
    assert "Gives the number." in text and "6*7?" in text and "Reference answer:\n42" in text


@pytest.mark.django_db
def test_a_failing_judge_records_nothing(fake_pool: Any, owner: Any, alpha: Any, caplog: Any) -> None:
    quality = Metric.objects.create(team=alpha, name="quality", kind="float")
    Evaluator.objects.create(team=alpha, name="judge", metric=quality, kind="judge", config={"rubric": "r"})
    run = RunFactory(team=alpha, pool=fake_pool.pool, created_by=owner, status="succeeded", answer="42")
    fake_pool.server.responder = lambda req: FakeReply("I cannot grade this.")
    _finished(run)
    fake_pool.server.responder = lambda req: FakeError(
        400, {"error": {"message": "bad request", "type": "invalid_request_error"}}
    )
    _finished(run)
    assert not Feedback.objects.exists()
    assert "judge" in caplog.text


def test_parse_score() -> None:
    assert parse_score("SCORE: 1") == 1.0 and parse_score("score=0.5 because") == 0.5
    assert parse_score(" .3 ") == 0.3 and parse_score("SCORE: 7") is None and parse_score("great") is None


@pytest.mark.runtime
@pytest.mark.django_db(transaction=True)
def test_a_real_run_is_evaluated_after_it_finishes(
    runtime_workers: Any, run_pool: Any, owner: Any, alpha: Any
) -> None:
    """End to end: the run executes (thread or Celery), the observer evaluates after commit."""
    from apps.runs.services import run_create, run_wait
    from tests.fixtures.waits import wait_until

    _evaluators(alpha)
    run = run_create(
        actor=owner,
        pool=run_pool.pool,
        question="What is 6*7?",
        api_request={"metadata": {"reference": "fake-critic-1 says"}},
    )
    run = run_wait(run.id, 60)
    assert run.status == "succeeded", run.error
    # The evaluators run after the run's last event was published (in the worker process in
    # distributed mode) and announce nothing: a condition wait on their rows.
    wait_until(lambda: Feedback.objects.filter(run=run).count() >= 3, 30, "three feedback rows")
    assert _values(run) == {"json": 0.0, "regex": 1.0, "exact": 0.0}


@pytest.mark.django_db
def test_a_judge_on_a_boolean_metric_passes_at_half(fake_pool: Any, owner: Any, alpha: Any) -> None:
    good = Metric.objects.create(team=alpha, name="good", kind="boolean")
    Evaluator.objects.create(team=alpha, name="judge", metric=good, kind="judge", config={"rubric": "r"})
    run = RunFactory(team=alpha, pool=fake_pool.pool, created_by=owner, status="succeeded", answer="42")
    fake_pool.server.responder = lambda req: FakeReply("SCORE: 0.4")
    _finished(run)
    item = Feedback.objects.get(run=run)
    assert item.value == 0.0 and item.comment == "judge score 0.4"


@pytest.mark.django_db
def test_the_team_evaluators_are_read_once_per_access_version(
    fake_pool: Any, owner: Any, alpha: Any, queries: Any
) -> None:
    """A finished run reads its team's evaluators from the process's cache while the access
    version holds (issue #15), and the next run after any evaluator change sees the change."""
    from apps.governance.access_version import read_stamp

    correct = _evaluators(alpha)

    def finished_run() -> Any:
        run = RunFactory(team=alpha, pool=fake_pool.pool, created_by=owner, status="succeeded", answer="42")
        event = {"type": "run.finished", "seq": 9, "data": {"status": "succeeded"}}
        observers.notify_after_commit(
            observers.RunEventView(
                run.pk, run.team_id, None, event, run.pool_id, "conductor", access_stamp=read_stamp()
            )
        )
        return run

    finished_run()
    queries.clear()
    warm = finished_run()
    assert queries.count(r'FROM "feedback_evaluator"') == 0, queries.common()
    assert set(_values(warm)) == {"json"}  # no reference: regex and exact skip
    Evaluator.objects.filter(name="off").update(
        enabled=True, kind="json_schema", config={"schema": {"type": "number"}}
    )
    changed = finished_run()
    assert _values(changed) == {"json": 0.0, "off": 1.0}
    Evaluator.objects.filter(metric=correct).delete()
    queries.clear()
    gone = finished_run()
    assert queries.count(r'FROM "feedback_evaluator"') == 1
    assert _values(gone) == {}
