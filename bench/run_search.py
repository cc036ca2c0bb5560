"""Run search at 100k runs (issue 42): server time per `/runs/?q=` and `/api/runs/?q=` request.

Not a test: prints figures for bench/SEARCH.md. Uses its own database (migrated; runs are added
once and reused on the next invocation). PostgreSQL needs the database to exist:

    .venv/bin/python bench/run_search.py --runs 100000
    createdb -h 127.0.0.1 -U postgres conductor_search_bench
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/conductor_search_bench .venv/bin/python bench/run_search.py --runs 100000

``--like`` also times the same searches as ``icontains`` scans (what a search without the
full-text indexes would do), for comparison.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlencode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
parser = argparse.ArgumentParser()
parser.add_argument("--runs", type=int, default=100_000)
parser.add_argument("--repeat", type=int, default=20)
parser.add_argument("--db", default="sqlite:////tmp/conductor_search_bench.sqlite3")
parser.add_argument("--like", action="store_true", help="also time icontains scans")
ARGS = parser.parse_args()
os.environ["DJANGO_SETTINGS_MODULE"] = "conductor_web.settings.local"
os.environ.setdefault("DATABASE_URL", ARGS.db)
os.environ.setdefault("DEBUG", "false")

import django  # noqa: E402

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.db.models import Q  # noqa: E402
from django.test import Client  # noqa: E402

from apps.governance.models import Team  # noqa: E402
from apps.governance.services import membership_set, team_create  # noqa: E402
from apps.runs.models import Run  # noqa: E402
from apps.workers.models import Pool  # noqa: E402

STATUSES = ["succeeded"] * 8 + ["failed", "cancelled", "blocked", "timed_out"]
# A Zipf-like vocabulary: a few words are in most runs, most words in few.
VOCAB = [f"w{n}" for n in range(20_000)]
WEIGHTS = [1 / (n + 1) for n in range(len(VOCAB))]


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choices(VOCAB, WEIGHTS, k=words))


def setup() -> tuple[object, object]:
    call_command("migrate", verbosity=0)
    User = get_user_model()
    team = Team.objects.filter(slug="searchbench").first() or team_create(
        actor=None, slug="searchbench", name="Search bench"
    )
    other = Team.objects.filter(slug="searchbench-other").first() or team_create(
        actor=None, slug="searchbench-other", name="Other"
    )
    member = User.objects.filter(username="searchbench").first()
    if member is None:
        member = User.objects.create_user("searchbench", password="x")
        membership_set(actor=None, team=team, user=member, role="member")
    reviewer = User.objects.filter(username="searchbench-reviewer").first()
    if reviewer is None:
        reviewer = User.objects.create_user("searchbench-reviewer", password="x")
        membership_set(actor=None, team=team, user=reviewer, role="reviewer")
    pool = Pool.objects.filter(slug="searchbench").first() or Pool.objects.create(
        slug="searchbench", name="Bench", team=team
    )
    have = Run.objects.filter(team__in=[team, other]).count()
    if have < ARGS.runs:
        rng = random.Random(42)
        batch: list[Run] = []
        t0 = time.perf_counter()
        for i in range(have, ARGS.runs):
            status = rng.choice(STATUSES)
            batch.append(
                Run(
                    team=team if i % 5 else other,
                    pool=pool,
                    created_by=member if i % 3 else None,
                    question=_text(rng, 14) + (" everest" if i % 1000 == 0 else ""),
                    answer=_text(rng, 60) if status == "succeeded" else "",
                    status=status,
                    answer_held=i % 50 == 0,
                    strategy="conductor",
                    preset="mini",
                    request_id=f"req-{i}",
                    api_request={"metadata": {"customer": f"c{i % 100}"}} if i % 2 else None,
                )
            )
            if len(batch) == 5000:
                Run.objects.bulk_create(batch)
                batch = []
        if batch:
            Run.objects.bulk_create(batch)
        print(
            f"inserted {ARGS.runs - have} runs in {time.perf_counter() - t0:.1f} s (index kept by the database)"
        )
    return member, reviewer


def timed(client: Client, url: str) -> tuple[float, float, int]:
    samples = []
    found = 0
    for _ in range(ARGS.repeat):
        t = time.perf_counter()
        response = client.get(url)
        samples.append((time.perf_counter() - t) * 1000)
        assert response.status_code == 200, (url, response.status_code)
        is_json = response["Content-Type"].startswith("application/json")
        found = (
            len(response.json()["results"]) if is_json else response.content.count(b'data-testid="run-row"')
        )
    samples.sort()
    return statistics.median(samples), samples[min(len(samples) - 1, int(len(samples) * 0.95))], found


def timed_like(terms: list[str]) -> tuple[float, float]:
    samples = []
    for _ in range(max(3, ARGS.repeat // 4)):
        q = Q()
        for t in terms:
            q &= Q(question__icontains=t) | Q(answer__icontains=t)
        t0 = time.perf_counter()
        list(Run.objects.filter(q).order_by("-created_at").values_list("pk", flat=True)[:51])
        samples.append((time.perf_counter() - t0) * 1000)
    samples.sort()
    return statistics.median(samples), samples[-1]


def main() -> None:
    member, reviewer = setup()
    total = Run.objects.count()
    print(f"db={connection.vendor} runs={total}")
    some = Run.objects.filter(team__slug="searchbench").order_by("pk")[1234]
    cases = [
        ("common word (w1)", {"q": "w1"}),
        ("mid word (w300)", {"q": "w300"}),
        ("rare word (w15000)", {"q": "w15000"}),
        ("two words (w2 w40)", {"q": "w2 w40"}),
        ("1 in 1000 (everest)", {"q": "everest"}),
        ("no match (zzz)", {"q": "zzzqqq"}),
        ("short id", {"q": str(some.pk)[:8]}),
        ("word + status=failed", {"q": "w5", "status": "failed"}),
        ("metadata customer=c7", {"metadata": "customer=c7"}),
        ("request_id", {"request_id": "req-4321"}),
    ]
    for who, user in (("member", member), ("reviewer", reviewer)):
        client = Client()
        client.force_login(user)
        print(f"\n-- as {who} --")
        print(f"{'search':28s} {'/runs/ p50':>11s} {'p95':>9s}   {'/api/runs/ p50':>14s} {'p95':>9s}  rows")
        for label, params in cases:
            p50, p95, n = timed(client, "/runs/?" + urlencode(params))
            a50, a95, _ = timed(client, "/api/runs/?" + urlencode(params))
            print(f"{label:28s} {p50:8.1f} ms {p95:6.1f} ms   {a50:11.1f} ms {a95:6.1f} ms  {n}")
    if ARGS.like:
        print("\n-- icontains scan over question and answer (no full-text index), first 51 rows --")
        for label, terms in [("rare word (w15000)", ["w15000"]), ("no match (zzzqqq)", ["zzzqqq"])]:
            p50, worst = timed_like(terms)
            print(f"{label:28s} p50 {p50:7.1f} ms   max {worst:7.1f} ms")


if __name__ == "__main__":
    main()
