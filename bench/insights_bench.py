"""`/insights/` at 100k runs: server time per request for each range, member and platform admin.

Not a test: prints figures for bench/INSIGHTS.md. Uses its own database (migrated; the runs and
their rollups are generated once and reused on the next invocation):

    .venv/bin/python bench/insights_bench.py --runs 100000
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/conductor_bench .venv/bin/python bench/insights_bench.py

The generator writes Run rows and the rollup rows the run-event observer (apps.insights.rollup)
would have written for them — same grain (team, pool, strategy, worker, hour), same buckets —
aggregated in Python, because replaying 100k runs through the sink would take hours here.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections import defaultdict
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
parser = argparse.ArgumentParser()
parser.add_argument("--runs", type=int, default=100_000)
parser.add_argument("--repeat", type=int, default=15)
parser.add_argument("--db", default="sqlite:////tmp/conductor_insights_bench.sqlite3")
ARGS = parser.parse_args()
os.environ["DJANGO_SETTINGS_MODULE"] = "conductor_web.settings.local"
os.environ.setdefault("DATABASE_URL", ARGS.db)
os.environ.setdefault("DEBUG", "false")

import django  # noqa: E402

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.test import Client  # noqa: E402
from django.utils import timezone  # noqa: E402

from apps.audit.models import RunReview  # noqa: E402
from apps.governance.models import Team  # noqa: E402
from apps.governance.services import membership_set, team_create  # noqa: E402
from apps.insights.models import (  # noqa: E402
    DAY,
    HOUR,
    RUN_ROW,
    GuardrailRollup,
    HistogramRollup,
    ReviewFact,
    Rollup,
)
from apps.insights.reviews import rebuild_facts  # noqa: E402
from apps.insights.rollup import hour_of, latency_bucket  # noqa: E402
from apps.runs.models import Run  # noqa: E402
from apps.workers.models import Pool  # noqa: E402

TEAMS = [f"ibench-{i}" for i in range(5)]
STRATEGIES = ["conductor", "single", "moa", "pev"]
WORKERS = ["w-gpt", "w-claude", "w-llama", "w-mistral", "w-gemini", "w-local"]
STATUSES = ["succeeded"] * 8 + ["failed", "blocked"]
# Review state of a run: most are never reviewed; some wait, some were decided.
REVIEWS = [""] * 12 + ["pending"] * 3 + ["approved"] * 3 + ["flagged", "needs_follow_up"]


def setup() -> tuple[Any, Any]:
    call_command("migrate", verbosity=0)
    User = get_user_model()
    teams = [Team.objects.filter(slug=s).first() or team_create(actor=None, slug=s, name=s) for s in TEAMS]
    member = User.objects.filter(username="ibench").first()
    if member is None:
        member = User.objects.create_user("ibench", password="x")
        membership_set(actor=None, team=teams[0], user=member, role="member")
    admin = User.objects.filter(username="ibench-admin").first() or User.objects.create_superuser(
        "ibench-admin", password="x"
    )
    pools = [
        Pool.objects.filter(slug=f"ibench-{t.slug}").first()
        or Pool.objects.create(slug=f"ibench-{t.slug}", name=t.slug, team=t)
        for t in teams
    ]
    have = Run.objects.filter(team__in=teams).count()
    if have < ARGS.runs:
        generate(teams, pools, member, have)
    if not RunReview.objects.filter(run__team__in=teams).exists():
        seed_reviews(teams)
    if not ReviewFact.objects.exists():  # bulk-created reviews (or a database older than it)
        rebuild_facts(RunReview, ReviewFact)
    return member, admin


def seed_reviews(teams: list[Team]) -> None:
    """One RunReview per decided run (approved, flagged, needs follow-up), 1 min to 2 days after it
    finished, by one of three reviewers: what the reviews chart reads."""
    rng = random.Random(15)
    t0 = time.perf_counter()
    decided = Run.objects.filter(team__in=teams, review_status__in=["approved", "flagged", "needs_follow_up"])
    reviews = [
        RunReview(
            run_id=run_id,
            reviewer_label=rng.choice(["rev-ana", "rev-bo", "rev-cy"]),
            status=status,
            reason="seeded" if status == "flagged" else "",
            created_at=finished + timedelta(seconds=rng.uniform(60, 2 * 86400)),
        )
        for run_id, status, finished in decided.values_list("pk", "review_status", "finished_at").iterator()
    ]
    created_at = RunReview._meta.get_field("created_at")
    created_at.auto_now_add = False  # keep the generated review times
    try:
        RunReview.objects.bulk_create(reviews, batch_size=2000)
    finally:
        created_at.auto_now_add = True
    print(f"generated {len(reviews)} reviews in {time.perf_counter() - t0:.1f}s")


def generate(teams: list[Team], pools: list[Pool], user: Any, have: int) -> None:
    rng = random.Random(18)
    now = timezone.now()
    rows: dict[tuple, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    hists: dict[tuple, int] = defaultdict(int)
    checks: dict[tuple, int] = defaultdict(int)
    runs = []
    t0 = time.perf_counter()
    for i in range(have, ARGS.runs):
        k = rng.randrange(len(teams))
        created = now - timedelta(seconds=rng.uniform(0, 30 * 86400))
        strategy = rng.choice(STRATEGIES)
        status = rng.choice(STATUSES)
        steps = 1 if strategy == "single" else rng.randint(2, 5)
        latency = rng.lognormvariate(8, 0.6)
        cost = Decimal(rng.randint(10, 5000)) / Decimal(1_000_000)
        review = rng.choice(REVIEWS)
        held = review == "pending" and status == "succeeded" and rng.random() < 0.3
        runs.append(
            Run(
                team=teams[k], pool=pools[k], created_by=user if k == 0 else None, question=f"q{i}",
                status=status, strategy=strategy, preset="", cost_usd=cost, latency_ms=latency,
                step_count=steps, input_tokens=300 * steps, output_tokens=80 * steps,
                finished_at=created + timedelta(milliseconds=latency), created_at=created,
                review_status=review, answer_held=held,
            )
        )  # fmt: skip
        base = (teams[k].pk, pools[k].pk, strategy, hour_of(created.timestamp()))
        r = rows[(*base, RUN_ROW)]
        r["runs"] += 1
        r[{"succeeded": "succeeded", "failed": "failed", "blocked": "blocked"}[status]] += 1
        r["steps"] += steps
        r["cost_usd"] += float(cost)
        r["input_tokens"] += 300 * steps
        r["output_tokens"] += 80 * steps
        r["orch_input_tokens"] += 0 if strategy == "single" else 400
        r["orch_output_tokens"] += 0 if strategy == "single" else 60
        r["latency_ms_sum"] += latency
        r["latency_count"] += 1
        hists[(*base, RUN_ROW, "latency", latency_bucket(latency))] += 1
        hists[(*base, RUN_ROW, "steps", float(steps))] += 1
        hists[(*base, RUN_ROW, "depth", 1.0)] += 1
        for _ in range(steps):
            w = rng.choice(WORKERS)
            step_latency = latency / steps
            s = rows[(*base, w)]
            s["steps"] += 1
            s["input_tokens"] += 300
            s["output_tokens"] += 80
            s["latency_ms_sum"] += step_latency
            s["latency_count"] += 1
            hists[(*base, w, "latency", latency_bucket(step_latency))] += 1
        checks[(*base, "pii", "input", rng.choice(["passed"] * 9 + ["intervened"]), "redact")] += 1
    # The observer keeps every count per hour and per UTC day: derive the day rows the same way.
    rows = {(*k, HOUR): v for k, v in rows.items()} | _days(rows, 5)
    hists = {(*k, HOUR): v for k, v in hists.items()} | _days(hists, 7)
    checks = {(*k, HOUR): v for k, v in checks.items()} | _days(checks, 8)
    created_at = Run._meta.get_field("created_at")
    with transaction.atomic():
        created_at.auto_now_add = False  # keep the generated creation times (spread over 30 days)
        try:
            Run.objects.bulk_create(runs, batch_size=2000)
        finally:
            created_at.auto_now_add = True
        Rollup.objects.bulk_create(
            [
                Rollup(
                    team_id=t, pool_id=p, strategy=s, hour=h, worker_key=w, grain=g,
                    **{f: (Decimal(str(round(v, 8))) if f == "cost_usd" else (v if f == "latency_ms_sum" else int(v)))
                       for f, v in vals.items()},
                )
                for (t, p, s, h, w, g), vals in rows.items()
            ],
            batch_size=2000,
        )  # fmt: skip
        HistogramRollup.objects.bulk_create(
            [
                HistogramRollup(
                    team_id=t,
                    pool_id=p,
                    strategy=s,
                    hour=h,
                    worker_key=w,
                    metric=m,
                    bucket=b,
                    count=n,
                    grain=g,
                )
                for (t, p, s, h, w, m, b, g), n in hists.items()
            ],
            batch_size=2000,
        )
        GuardrailRollup.objects.bulk_create(
            [
                GuardrailRollup(
                    team_id=t,
                    pool_id=p,
                    strategy=s,
                    hour=h,
                    rule=r,
                    stage=st,
                    status=su,
                    action=a,
                    count=n,
                    grain=g,
                )
                for (t, p, s, h, r, st, su, a, g), n in checks.items()
            ],
            batch_size=2000,
        )
    print(
        f"generated {len(runs)} runs, {len(rows)} rollup rows, {len(hists)} histogram rows, "
        f"{len(checks)} guardrail rows in {time.perf_counter() - t0:.1f}s"
    )


def _days(hourly: dict, width: int) -> dict:
    """Sum hour rows (key[3] is the hour) into day rows, keyed like the hour rows plus DAY."""
    out: dict = {}
    for key, value in hourly.items():
        day = (*key[:3], key[3].replace(hour=0), *key[4:width], DAY)
        if isinstance(value, dict):
            acc = out.setdefault(day, defaultdict(float))
            for f, v in value.items():
                acc[f] += v
        else:
            out[day] = out.get(day, 0) + value
    return out


def timed(client: Client, url: str) -> list[float]:
    client.get(url)  # warm
    out = []
    for _ in range(ARGS.repeat):
        t = time.perf_counter()
        resp = client.get(url)
        out.append((time.perf_counter() - t) * 1000)
        assert resp.status_code == 200, resp.status_code
    return out


def main() -> None:
    member, admin = setup()
    print(
        f"database: {connection.vendor}; runs: {Run.objects.count()}; rollup rows: {Rollup.objects.count()}"
    )
    print(f"load average: {os.getloadavg()}")
    print("| viewer | range | p50 ms | p95 ms |\n|---|---|---|---|")
    for label, user in (("member (1 team)", member), ("platform admin (5 teams)", admin)):
        client = Client()
        client.force_login(user)
        for rng in ("24h", "7d", "30d"):
            ms = sorted(timed(client, f"/insights/?range={rng}"))
            p95 = ms[min(len(ms) - 1, int(len(ms) * 0.95))]
            print(f"| {label} | {rng} | {statistics.median(ms):.0f} | {p95:.0f} |")


if __name__ == "__main__":
    main()
