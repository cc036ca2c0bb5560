"""Rollups kept by the run-event observer, /insights/ numbers and visibility, and /metrics, after
real runs on the runtime of the mode (thread / Celery worker) against the loopback fake provider."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.db.models import Sum
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from apps.insights.models import DAY, HOUR, RUN_ROW, HistogramRollup, Rollup
from apps.insights.selectors import percentile
from apps.runs.models import Run, RunEvent, RunStatus
from apps.runs.services import run_create, run_wait
from tests.factories.policies import publish_policy
from tests.fixtures.runs import scripted_plan
from tests.runtime import MODE

TOKEN = "metrics-token-for-tests"


def _samples(client: Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    resp = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert resp.status_code == 200, resp.content
    out = {}
    for family in text_string_to_metric_families(resp.content.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _sum(samples: dict[Any, float], name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in samples.items() if n == name and all((k, labels[k]) in ls for k in labels))


def _run_mix(pool: Any, owner: Any) -> list[Run]:
    ids = [
        run_create(actor=owner, pool=pool.pool, question=f"Q{i}?", strategy=strategy).id
        for i, strategy in enumerate(["conductor", "conductor", "single"])
    ]
    runs = [run_wait(i, 60) for i in ids]
    assert all(r.status == RunStatus.SUCCEEDED for r in runs), [(r.status, r.error) for r in runs]
    return runs


@pytest.mark.runtime
@pytest.mark.django_db(transaction=True)
def test_rollups_page_and_metrics_follow_real_runs(
    runtime_workers: Any, fake_pool: Any, owner: Any, outsider: Any, alpha: Any, settings: Any
) -> None:
    settings.METRICS_BEARER_TOKEN = TOKEN
    scripted_plan(fake_pool.server)
    publish_policy(alpha, {"budgets": {"daily": {"hard_usd": "5"}}})
    scraper = Client()
    before = _samples(scraper)
    runs = _run_mix(fake_pool, owner)

    # Run rows: one per (team, pool, strategy, hour); totals equal the runs'.
    rows = Rollup.objects.filter(worker_key=RUN_ROW, grain=HOUR)
    assert rows.aggregate(n=Sum("runs"))["n"] == 3
    assert rows.aggregate(c=Sum("cost_usd"))["c"] == sum((r.cost_usd or Decimal(0) for r in runs), Decimal(0))
    planning_in = sum(
        (e.data.get("usage") or {}).get("input_tokens") or 0
        for e in RunEvent.objects.filter(type="plan.proposed")
    )
    assert rows.aggregate(t=Sum("orch_input_tokens"))["t"] == planning_in > 0
    # Worker rows: one step per call; latency histograms count every finished step.
    steps = Rollup.objects.filter(grain=HOUR).exclude(worker_key=RUN_ROW)
    assert steps.aggregate(n=Sum("steps"))["n"] == 7  # 3 + 3 + 1
    for grain in (HOUR, DAY):  # kept per hour and per day alike
        assert HistogramRollup.objects.filter(metric="steps", grain=grain).aggregate(n=Sum("count"))["n"] == 3
    # Time to first token: one observation per run that streamed (the fake provider streams).
    streamed = RunEvent.objects.filter(type="step.delta").values("run_id").distinct().count()
    assert streamed == 3
    ttft = HistogramRollup.objects.filter(metric="ttft", grain=HOUR, worker_key=RUN_ROW)
    assert ttft.aggregate(n=Sum("count"))["n"] == streamed

    page = Client()
    page.force_login(owner)
    data = page.get("/insights/").context["data"]
    assert data["totals"]["runs"] == 3
    charts = {c["id"]: c for c in data["charts"]}
    for cid in ("orchestration", "latency", "plans"):
        assert not charts[cid]["empty"], cid
    # The fake workers are unpriced: $0 bars would draw bare axes from -1 to 1 (issue 42), so the
    # chart says why it is empty instead.
    assert charts["spend"]["empty"] and "unpriced" in charts["spend"]["empty_note"]
    first_token = next(t for t in charts["latency"]["data"] if t["name"] == "first token p50")
    assert [x for x in first_token["x"] if x is not None], first_token  # horizontal bars
    assert charts["spend"]["data"][0]["name"] == "alpha"
    assert {row["strategy"]: row["runs"] for row in data["strategies"]} == {"conductor": 2, "single": 1}
    # By day, the spend chart draws the daily budget as a line.
    week = page.get("/insights/", {"range": "7d"}).context["data"]["charts"][0]["data"]
    assert [t["y"] for t in week if t["name"] == "alpha daily budget"] == [[5.0, 5.0]]
    # A filter narrows every number.
    assert page.get("/insights/", {"strategy": "single"}).context["data"]["totals"]["runs"] == 1
    # The drill-down link of a bar opens the runs list filtered to it.
    link = charts["orchestration"]["data"][0]["customdata"][0]
    assert link.startswith("/runs/?") and "strategy=" in link

    # An outsider (beta) sees none of alpha's numbers.
    other = Client()
    other.force_login(outsider)
    resp = other.get("/insights/")
    assert resp.context["data"]["totals"]["runs"] == 0
    assert all(c["empty"] for c in resp.context["data"]["charts"])
    assert b"alpha" not in resp.content.split(b'id="insight-charts"')[1]
    assert other.get("/insights/", {"team": "alpha"}).status_code == 400  # not offered, not accepted

    after = _samples(scraper)
    for strategy, n in (("conductor", 2), ("single", 1)):
        moved = _sum(
            after, "conductor_runs_finished_total", team="alpha", strategy=strategy, status="succeeded"
        ) - _sum(before, "conductor_runs_finished_total", team="alpha", strategy=strategy, status="succeeded")
        assert moved == n, strategy
    assert _sum(after, "conductor_audit_sequence_length") >= _sum(before, "conductor_audit_sequence_length")
    if MODE == "embedded":  # the calls ran in this process: its histograms saw each one
        calls = RunEvent.objects.filter(type="plan.proposed").count() + 7
        moved = _sum(after, "gen_ai_client_operation_duration_seconds_count", team="alpha") - _sum(
            before, "gen_ai_client_operation_duration_seconds_count", team="alpha"
        )
        assert moved == calls
        tokens = _sum(
            after, "gen_ai_client_token_usage_sum", team="alpha", gen_ai_token_type="output"
        ) - _sum(before, "gen_ai_client_token_usage_sum", team="alpha", gen_ai_token_type="output")
        assert tokens == sum(r.output_tokens for r in runs)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("token", "header", "status", "says"),
    [
        ("", f"Bearer {TOKEN}", 404, b"METRICS_BEARER_TOKEN is not set"),
        (TOKEN, "", 401, b"METRICS_BEARER_TOKEN"),
        (TOKEN, "Bearer wrong", 403, b"does not match METRICS_BEARER_TOKEN"),
        (TOKEN, f"Bearer {TOKEN}", 200, b"conductor_audit_sequence_length"),
    ],
)
def test_metrics_needs_the_bearer_token(
    settings: Any, token: str, header: str, status: int, says: bytes
) -> None:
    settings.METRICS_BEARER_TOKEN = token
    resp = Client().get("/metrics", headers={"Authorization": header} if header else {})
    assert resp.status_code == status and says in resp.content


def test_percentile_reads_buckets() -> None:
    hist = {100.0: 5, 500.0: 4, float("inf"): 1}
    assert percentile(hist, 0.5) == 100.0
    assert percentile(hist, 0.9) == 500.0
    assert percentile(hist, 1.0) == 500.0  # the open bucket reports its lower bound
    assert percentile({}, 0.5) is None


@pytest.mark.django_db
def test_grafana_dashboard_uses_only_exposed_metrics(settings: Any) -> None:
    import json
    import re
    from pathlib import Path

    settings.METRICS_BEARER_TOKEN = TOKEN
    resp = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    families = {f.name for f in text_string_to_metric_families(resp.content.decode())}
    dashboard = json.loads(
        (Path(__file__).resolve().parents[2] / "deploy" / "grafana-dashboard.json").read_text()
    )
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    used = {
        re.sub(r"_(total|bucket|sum|count)$", "", m)
        for m in re.findall(r"\b(?:conductor_|gen_ai_client_)\w+", exprs)
    }
    assert used and used <= families, used - families
