"""`/runs/` at 100k runs: server time per request for the common filters.

Not a test: prints figures for bench/RUNS.md. Uses its own database (migrated; runs are added
once and reused on the next invocation):

    .venv/bin/python bench/runs_list.py --runs 100000
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/conductor_bench .venv/bin/python bench/runs_list.py --runs 100000
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
parser = argparse.ArgumentParser()
parser.add_argument("--runs", type=int, default=100_000)
parser.add_argument("--repeat", type=int, default=20)
parser.add_argument("--db", default="sqlite:////tmp/conductor_runs_bench.sqlite3")
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

from apps.governance.models import Team  # noqa: E402
from apps.governance.services import membership_set, team_create  # noqa: E402
from apps.runs.models import Run, Step  # noqa: E402
from apps.workers.models import Pool  # noqa: E402

STATUSES = ["succeeded"] * 8 + ["failed", "cancelled", "blocked", "timed_out"]
STRATEGIES = ["conductor", "single", "moa", "pev"]


def setup() -> tuple[object, object]:
    call_command("migrate", verbosity=0)
    User = get_user_model()
    team = Team.objects.filter(slug="runsbench").first() or team_create(
        actor=None, slug="runsbench", name="Runs bench"
    )
    other = Team.objects.filter(slug="runsbench-other").first() or team_create(
        actor=None, slug="runsbench-other", name="Other"
    )
    user = User.objects.filter(username="runsbench").first()
    if user is None:
        user = User.objects.create_user("runsbench", password="x")
        membership_set(actor=None, team=team, user=user, role="member")
    pool = Pool.objects.filter(slug="runsbench").first() or Pool.objects.create(
        slug="runsbench", name="Bench", team=team
    )
    have = Run.objects.filter(team__in=[team, other]).count()
    if have < ARGS.runs:
        rng = random.Random(7)
        now = timezone.now()
        batch: list[Run] = []
        for i in range(have, ARGS.runs):
            batch.append(
                Run(
                    team=team if i % 5 else other,
                    pool=pool,
                    created_by=user if i % 3 else None,
                    question=f"q{i}",
                    status=rng.choice(STATUSES),
                    strategy=rng.choice(STRATEGIES),
                    preset="",
                    input_tokens=rng.randint(10, 5000),
                    output_tokens=rng.randint(10, 2000),
                    step_count=3,
                )
            )
            if len(batch) == 5000:
                created = Run.objects.bulk_create(batch)
                Step.objects.bulk_create(
                    [
                        Step(run=r, index=0, worker_key=f"w{k % 7}", instruction="x")
                        for k, r in enumerate(created)
                        if k % 10 == 0
                    ]
                )
                batch = []
        if batch:
            Run.objects.bulk_create(batch)
        # Spread creation times over ~90 days (auto_now_add stamped them all "now").
        step = timedelta(seconds=77)
        ids = list(Run.objects.order_by("pk").values_list("pk", flat=True))
        with transaction.atomic():
            for k, pk in enumerate(ids):
                Run.objects.filter(pk=pk).update(created_at=now - step * k)
    return user, team


def timed(client: Client, url: str) -> tuple[float, float]:
    samples = []
    for _ in range(ARGS.repeat):
        t = time.perf_counter()
        response = client.get(url)
        samples.append((time.perf_counter() - t) * 1000)
        assert response.status_code == 200, response.status_code
    samples.sort()
    return statistics.median(samples), samples[min(len(samples) - 1, int(len(samples) * 0.95))]


def main() -> None:
    user, _team = setup()
    client = Client()
    client.force_login(user)
    total = Run.objects.count()
    vendor = connection.vendor
    print(
        f"db={vendor} runs={total} (visible to the user: {Run.objects.filter(team__slug='runsbench').count()})"
    )
    since = (timezone.now() - timedelta(days=10)).date().isoformat()
    for label, url in [
        ("first page", "/runs/"),
        ("page 50", "/runs/?page=50"),
        ("status=failed", "/runs/?status=failed"),
        ("strategy=moa sort=cost", "/runs/?strategy=moa&sort=cost"),
        ("user=runsbench", "/runs/?user=runsbench"),
        ("worker=w3", "/runs/?worker=w3"),
        ("date_from 10 days", f"/runs/?date_from={since}"),
    ]:
        p50, p95 = timed(client, url)
        print(f"{label:28s} p50 {p50:7.1f} ms   p95 {p95:7.1f} ms")


if __name__ == "__main__":
    main()
