"""Python CPU per call of the run path's compiled statements against what they replace.

Not a test: prints the table for bench/API.md (issue #15, fourteenth pass). Both variants run in
this one process, alternating round by round, so a slow phase of the machine weighs on both:

- ``claim``: a run's hand-off and claim as the distributed path sends them, each in its own
  transaction: the outbox row taken (``dispatched_at`` still NULL, attempts + 1), the run claimed
  (queued, not cancelled; attempts + 1), the outbox row deleted. ``orm``: the querysets
  ``apps.runs.execution`` built before (``filter().update(F() + 1)``, ``filter().delete()``);
  ``compiled``: its ``_DISPATCH_TAKE``, ``_CLAIM`` and ``_DISPATCH_DELETE``.
- ``upsert``: one run's rollup addition (its run row and worker row, hour and day: four rows in
  one statement). ``all bound``: every counter a parameter, zeros included (as before);
  ``used bound``: ``apps.insights.upsert.upsert_add``, the keys and the used counters only.

    .venv/bin/python bench/statements.py                                   # SQLite
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/conductor_statements_bench \\
      .venv/bin/python bench/statements.py

PostgreSQL: the database named must end in ``_bench``; it is dropped and recreated.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _live_setup import recreate_database

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--calls", type=int, default=300, help="calls per variant and round")
parser.add_argument("--rounds", type=int, default=6)
ARGS = parser.parse_args()
SQLITE = Path("/tmp/conductor_statements_bench.sqlite3")
os.environ["DJANGO_SETTINGS_MODULE"] = "conductor_web.settings.local"
os.environ.setdefault("DATABASE_URL", f"sqlite:///{SQLITE}")
for var in ("REDIS_URL", "CELERY_BROKER_URL"):
    os.environ.pop(var, None)  # the statements only: no broker, no channel layer

if urlparse(os.environ["DATABASE_URL"]).scheme.startswith("postgres"):
    recreate_database(os.environ["DATABASE_URL"])
else:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{SQLITE}{suffix}").unlink(missing_ok=True)

import django  # noqa: E402

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.db.models import F, Model  # noqa: E402
from django.utils import timezone  # noqa: E402

from apps.governance.services import team_create  # noqa: E402
from apps.insights import upsert  # noqa: E402
from apps.insights.models import Rollup  # noqa: E402
from apps.runs.execution.claim import _CLAIM, _DISPATCH_DELETE, _DISPATCH_TAKE  # noqa: E402
from apps.runs.models import Run, RunDispatch, RunStatus  # noqa: E402
from apps.workers.models import Pool  # noqa: E402

call_command("migrate", verbosity=0)
admin = get_user_model().objects.create_superuser("bench-admin", "bench@example.test", "x")
team = team_create(actor=admin, slug="bench", name="bench")
pool = Pool.objects.create(team=team, slug="bench-pool", name="bench pool")
LEASE = timedelta(seconds=60)


def queued_runs(n: int) -> list[Any]:
    runs = Run.objects.bulk_create([Run(team=team, pool=pool, question="q") for _ in range(n)])
    RunDispatch.objects.bulk_create([RunDispatch(run=run) for run in runs])
    return [run.pk for run in runs]


def claim_orm(ids: list[Any]) -> None:
    now = timezone.now()
    for run_id in ids:
        with transaction.atomic():
            RunDispatch.objects.filter(pk=run_id, dispatched_at__isnull=True).update(
                dispatched_at=now, dispatched_by="bench", attempts=F("attempts") + 1
            )
        with transaction.atomic():
            Run.objects.filter(pk=run_id, status=RunStatus.QUEUED, cancel_requested=False).update(
                status=RunStatus.RUNNING,
                started_at=now,
                lease_owner="bench",
                lease_expires_at=now + LEASE,
                attempts=F("attempts") + 1,
            )
            RunDispatch.objects.filter(pk=run_id).delete()


def claim_compiled(ids: list[Any]) -> None:
    now = timezone.now()
    for run_id in ids:
        with transaction.atomic():
            _DISPATCH_TAKE.execute(run_id, (now, "bench"), increments=(1,))
        with transaction.atomic():
            _CLAIM.execute(
                (run_id, RunStatus.QUEUED, False),
                (RunStatus.RUNNING, now, "bench", now + LEASE),
                increments=(1,),
            )
            _DISPATCH_DELETE.execute(run_id)


def upsert_all_bound(model: type[Model], rows: Any) -> None:
    """The upsert as it was: every counter of every row a parameter (zeros prepared per call)."""
    keys, counters = upsert._shape(model)
    used = sorted({name for amounts in rows.values() for name in amounts})
    qn = connection.ops.quote_name
    table = qn(model._meta.db_table)
    one = "(" + ", ".join(["%s"] * (len(keys) + len(counters))) + ")"
    column = {f.name: qn(str(f.column)) for f in counters}
    sql = (
        f"INSERT INTO {table} ({', '.join(qn(str(f.column)) for f in [*keys, *counters])}) "
        f"VALUES {', '.join([one] * len(rows))} ON CONFLICT ({', '.join(qn(str(f.column)) for f in keys)}) "
        f"DO UPDATE SET {', '.join(f'{column[n]} = {table}.{column[n]} + EXCLUDED.{column[n]}' for n in used)}"
    )
    zeros = [f.get_db_prep_save(f.get_default(), connection) for f in counters]
    params: list[Any] = []
    for _, key_params, key in sorted((*upsert._prepared_key(model, connection.vendor, k), k) for k in rows):
        params.extend(key_params)
        for field, zero in zip(counters, zeros, strict=True):
            value = rows[key].get(field.name)
            params.append(zero if value is None else upsert.db_value(field, value, connection))
    upsert.execute(connection, sql, params)


HOUR = timezone.now().replace(minute=0, second=0, microsecond=0)


def one_runs_rollup() -> Any:
    bumps = upsert.Bumps()
    key = {"team_id": team.pk, "pool_id": pool.pk, "strategy": "single", "hour": HOUR}
    bumps.add(Rollup, {**key, "worker_key": ""}, runs=1, succeeded=1, latency_ms_sum=10.4, latency_count=1)
    bumps.add(Rollup, {**key, "worker_key": "w0"}, steps=1, input_tokens=7, output_tokens=1)
    return bumps.rows[Rollup]


def upsert_calls(write: Callable[[type[Model], Any], None]) -> None:
    for _ in range(ARGS.calls):
        with transaction.atomic():
            write(Rollup, one_runs_rollup())


# (statement, variant) -> a call that sets up its rows (untimed) and returns the timed work.
VARIANTS: dict[tuple[str, str], Callable[[], Callable[[], None]]] = {
    ("claim", "orm"): lambda: functools.partial(claim_orm, queued_runs(ARGS.calls)),
    ("claim", "compiled"): lambda: functools.partial(claim_compiled, queued_runs(ARGS.calls)),
    ("upsert", "all bound"): lambda: functools.partial(upsert_calls, upsert_all_bound),
    ("upsert", "used bound"): lambda: functools.partial(upsert_calls, upsert.upsert_add),
}
results: dict[tuple[str, str], list[float]] = {key: [] for key in VARIANTS}
for round_ in range(ARGS.rounds):
    for key in list(VARIANTS) if round_ % 2 == 0 else list(VARIANTS)[::-1]:
        work = VARIANTS[key]()
        started = time.process_time()
        work()
        results[key].append((time.process_time() - started) / ARGS.calls * 1e6)

print(
    f"\n{connection.vendor}, {ARGS.calls} calls x {ARGS.rounds} rounds, Python CPU per call (this process)\n"
)
print("| statement | variant | median µs | rounds (µs) |\n|---|---|---:|---|")
for (what, name), values in results.items():
    print(f"| {what} | {name} | {statistics.median(values):.0f} | {' '.join(f'{v:.0f}' for v in values)} |")
