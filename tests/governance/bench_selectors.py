"""Selector and grant benchmarks (not collected by default: run this file explicitly).

CONDUCTOR_TEST_ID=bench .venv/bin/python -m pytest tests/governance/bench_selectors.py -q -s
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import pytest

from apps.audit.models import AuditEvent
from apps.governance import selectors as sel
from apps.governance.models import Role
from apps.runs.models import Run
from apps.workers.models import Pool
from tests.factories.governance import TeamFactory, UserFactory, add_member
from tests.factories.workers import PoolFactory, WorkerFactory

TEAMS, MEMBERS, RUNS_PER_TEAM = 20, 10, 500


def _time(fn: Callable[[], Any], n: int = 50) -> tuple[float, float]:
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t) * 1000)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.99) - 1]


@pytest.mark.django_db
def test_bench_selectors() -> None:
    worker = WorkerFactory()
    teams, users = [], []
    t0 = time.perf_counter()
    for i in range(TEAMS):
        team = TeamFactory(slug=f"bench-{i}")
        PoolFactory(team=team, slug=f"bench-pool-{i}", workers=[worker])
        teams.append(team)
    grant_times = []
    for team in teams:
        for j in range(MEMBERS):
            user = UserFactory()
            t = time.perf_counter()
            add_member(team, user, Role.MEMBER if j else Role.POLICY_ADMIN)
            grant_times.append((time.perf_counter() - t) * 1000)
            users.append(user)
    setup_s = time.perf_counter() - t0
    runs = []
    for team in teams:
        pool = team.owned_pools.first()
        runs += [Run(team=team, pool=pool, created_by=users[0], question="q") for _ in range(RUNS_PER_TEAM)]
    Run.objects.bulk_create(runs, batch_size=1000)
    member = users[MEMBERS + 3]  # a plain member of team 1
    run = Run.objects.filter(team=teams[1]).first()
    rows = {
        "runs_visible_to(member).count()": _time(lambda: Run.objects.visible_to(member, "view").count()),
        "runs_visible_to(member)[:50] list": _time(lambda: list(Run.objects.visible_to(member, "view")[:50])),
        "pools_usable_by(member) list": _time(lambda: list(Pool.objects.visible_to(member, "use"))),
        "teams_visible_to(member) list": _time(lambda: list(sel.teams_visible_to(member))),
        "audit_events_visible_to(member).count()": _time(
            lambda: AuditEvent.objects.visible_to(member, "view").count()
        ),
        "can_view_run(member, run)": _time(lambda: Run.objects.allows(member, "view", run)),
        "can_use_pool(member, pool)": _time(
            lambda: Pool.objects.allows(member, "use", teams[1].owned_pools.first())
        ),
    }
    print(f"\n{TEAMS} teams x {MEMBERS} members, {TEAMS * RUNS_PER_TEAM} runs; setup {setup_s:.1f}s")
    print(
        f"membership_set (grant sync + audit): p50 {statistics.median(grant_times):.2f} ms, "
        f"max {max(grant_times):.2f} ms"
    )
    print("| selector | p50 ms | p99 ms |\n|---|---|---|")
    for name, (p50, p99) in rows.items():
        print(f"| {name} | {p50:.2f} | {p99:.2f} |")
    assert Run.objects.visible_to(member, "view").count() == RUNS_PER_TEAM
