"""An experiment end to end on the runtime of the mode: upload through the page, start, every run
scored by the after-commit observer, the aggregates, the audit trail; cancel; teach the router."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from apps.audit.models import AuditEvent
from apps.audit.services import audit_flush
from apps.experiments import selectors, services
from apps.experiments.models import Dataset, Experiment, ExperimentRun
from apps.runs.models import Run
from tests.experiments.helpers import QUESTIONS, Responder, jsonl, wait_runs_settled
from tests.fixtures.waits import wait_runs

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]
ARMS = ["single:fake-solver", "single:fake-planner", "single:fake-critic", "conductor-mini"]


def _wait_terminal(experiment: Experiment, timeout_s: float = 90) -> Experiment:
    """Until every run of the experiment ended (their events wake the wait), then the refresh the
    page's progress endpoint makes: it scores any run the after-commit observer has not yet."""
    rows = ExperimentRun.objects.filter(experiment=experiment, run__isnull=False)
    wait_runs(list(rows.values_list("run_id", flat=True)), timeout=timeout_s)
    services.experiment_refresh(experiment)
    experiment.refresh_from_db()
    assert experiment.is_terminal, f"experiment still {experiment.status}: {selectors.progress(experiment)}"
    return experiment


def _upload(client: Client, data: bytes, name: str = "arith-geo") -> Any:
    return client.post(
        "/experiments/datasets/",
        {"team": "alpha", "name": name, "file": SimpleUploadedFile("set.jsonl", data, "application/jsonl")},
    )


def test_experiment_end_to_end(runtime_workers: Any, fake_pool: Any, owner: Any, team_admin: Any) -> None:
    fake_pool.server.responder = Responder()
    client = Client()
    client.force_login(owner)
    assert _upload(client, jsonl()).status_code == 302
    dataset = Dataset.objects.get(name="arith-geo")
    assert dataset.row_count == 4 and dataset.items.count() == 4

    page = client.post(
        "/experiments/",
        {"dataset": dataset.pk, "pool": "fake", "arms": ARMS, "evaluator": "exact", "seed": 7},
    )
    assert page.status_code == 302, page.content.decode()[:2000]
    experiment = Experiment.objects.get()
    assert page["Location"] == f"/experiments/{experiment.pk}/"
    assert experiment.models_at_start["workers"]["fake-solver"] == "fake-solver-1"
    assert experiment.models_at_start["conductor"] == "fake-conductor-1"
    assert ExperimentRun.objects.filter(experiment=experiment).count() == 16

    experiment = _wait_terminal(experiment)
    assert experiment.status == "succeeded"
    # Every run was scored by the observer or the refresh; none twice (one row per item and arm).
    assert ExperimentRun.objects.filter(experiment=experiment, scored_at__isnull=True).count() == 0

    data = selectors.results(experiment)
    table = {row["arm"]: row for row in data["table"]}
    assert table["single:fake-solver"]["accuracy"] == pytest.approx(0.5)
    assert table["single:fake-planner"]["accuracy"] == pytest.approx(0.5)
    assert table["single:fake-critic"]["accuracy"] == pytest.approx(0.0)
    assert table["conductor-mini"]["accuracy"] == pytest.approx(0.0)
    assert table["single:fake-solver"]["tokens_total"] > 0
    assert table["single:fake-solver"]["latency_p50_ms"] is not None
    tags = {t["tag"]: {c["arm"]: c["accuracy"] for c in t["cells"]} for t in data["tags"]}
    assert tags["math"]["single:fake-solver"] == 1.0 and tags["math"]["single:fake-planner"] == 0.0
    assert tags["geo"]["single:fake-planner"] == 1.0 and tags["geo"]["single:fake-solver"] == 0.0
    assert [d["index"] for d in data["disagreements"]] == [1, 2, 3, 4]
    assert not data["scatter"]["empty"] and len(data["scatter"]["data"]) == 4

    detail = client.get(f"/experiments/{experiment.pk}/")
    assert detail.status_code == 200
    body = detail.content.decode()
    assert 'data-testid="results-table"' in body and 'data-chart="accuracy-cost"' in body
    assert "50 %" in body
    progress = client.get(f"/experiments/{experiment.pk}/progress/").json()
    assert progress == {
        "id": experiment.pk,
        "status": "succeeded",
        "done": 16,
        "total": 16,
        "percent": 100,
        "terminal": True,
    }

    audit_flush()
    assert (
        AuditEvent.objects.filter(event_type="experiment.dataset_uploaded", object_id=str(dataset.pk)).count()
        == 1
    )
    started = AuditEvent.objects.get(event_type="experiment.started", object_id=str(experiment.pk))
    assert started.payload["runs"] == 16 and started.payload["seed"] == 7
    assert "What is" not in str(started.payload)
    finished = AuditEvent.objects.get(event_type="experiment.finished", object_id=str(experiment.pk))
    assert finished.payload["status"] == "succeeded"

    # Teaching the router: a plain member is refused naming the permission; an admin teaches.
    refused = client.post(f"/experiments/{experiment.pk}/teach/")
    assert refused.status_code == 403 and b"governance.manage_team" in refused.content
    admin = Client()
    admin.force_login(team_admin)
    assert admin.post(f"/experiments/{experiment.pk}/teach/").status_code == 302
    audit_flush()
    snap = AuditEvent.objects.filter(event_type="router.snapshot").order_by("-id").first()
    assert snap is not None and snap.payload["offline_examples"] == 16


def test_cancel_stops_every_unfinished_run(runtime_workers: Any, fake_pool: Any, owner: Any) -> None:
    responder = Responder(gated=True)
    fake_pool.server.responder = responder
    client = Client()
    client.force_login(owner)
    assert _upload(client, jsonl()).status_code == 302
    dataset = Dataset.objects.get()
    experiment = services.experiment_start(
        actor=owner, dataset=dataset, pool=fake_pool.pool, arms=["single:fake-solver", "pev"]
    )
    try:
        resp = client.post(f"/experiments/{experiment.pk}/cancel/")
        assert resp.status_code == 302
        experiment.refresh_from_db()
        assert experiment.status == "cancelled"
        runs = Run.objects.filter(pk__in=ExperimentRun.objects.filter(experiment=experiment).values("run_id"))
        assert all(r.cancel_requested for r in runs)
    finally:
        responder.gate.set()
        wait_runs_settled()
    # Every run ended (wait_runs_settled): one refresh scores those the observer has not yet.
    services.experiment_refresh(experiment)
    assert not ExperimentRun.objects.filter(experiment=experiment, scored_at__isnull=True).exists()
    experiment.refresh_from_db()
    assert experiment.status == "cancelled"  # runs finishing late do not revive it
    cancelled = ExperimentRun.objects.filter(experiment=experiment, status="cancelled")
    assert cancelled.exists()
    # A cancelled run never answered: it is not counted as wrong against its strategy.
    assert all(r.score is None for r in cancelled)
    audit_flush()
    event = AuditEvent.objects.get(event_type="experiment.cancelled", object_id=str(experiment.pk))
    assert event.payload["runs_cancelled"] >= 1


def test_bad_upload_is_refused_line_by_line_and_nothing_is_stored(fake_pool: Any, owner: Any) -> None:
    client = Client()
    client.force_login(owner)
    bad = b'{"input": "ok", "reference": "1"}\n{oops\n{"reference": "x"}\n'
    resp = _upload(client, bad)
    assert resp.status_code == 400
    body = resp.content.decode()
    assert "line 2: invalid JSON" in body and "line 3: missing" in body
    assert Dataset.objects.count() == 0


def test_start_refusals_name_the_field(fake_pool: Any, owner: Any, reviewer: Any, alpha: Any) -> None:
    items = __import__("apps.experiments.datasets", fromlist=["parse_jsonl"]).parse_jsonl(
        jsonl(QUESTIONS[:1])
    )
    dataset = services.dataset_upload(actor=owner, team=alpha, name="one", items=items)
    with pytest.raises(services.ExperimentError, match="not a strategy of the pool") as exc:
        services.experiment_start(actor=owner, dataset=dataset, pool=fake_pool.pool, arms=["single:nobody"])
    assert exc.value.field == "arms"
    with pytest.raises(services.ExperimentError, match="at least one"):
        services.experiment_start(actor=owner, dataset=dataset, pool=fake_pool.pool, arms=[])
    with pytest.raises(PermissionError, match=r"governance\.run_on_team"):
        services.experiment_start(actor=reviewer, dataset=dataset, pool=fake_pool.pool, arms=["pev"])
    assert Experiment.objects.count() == 0


def test_score_answer_exact_and_regex() -> None:
    assert services.score_answer("exact", "  paris ", "Paris") == 1.0
    assert services.score_answer("exact", "Paris, France", "Paris") == 0.0
    assert services.score_answer("regex", "The answer is 42.", r"\b42\b") == 1.0
    assert services.score_answer("regex", "The answer is 420.", r"\b42\b") == 0.0
    assert services.score_answer("exact", "anything", None) is None
