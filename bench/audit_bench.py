"""Audit trail benchmarks: appends/s, verify time, export throughput, search latency.

Not a test: prints figures for bench/AUDIT.md. Use a dedicated database (it migrates it, and the
``generate`` step TRUNCATEs/DELETEs the audit table):

    # PostgreSQL (create the database once: createdb -h 127.0.0.1 -U postgres conductor_bench)
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/conductor_bench \\
        .venv/bin/python bench/audit_bench.py all --events 1000000
    # SQLite
    DATABASE_URL=sqlite:////tmp/conductor_bench.sqlite3 \\
        .venv/bin/python bench/audit_bench.py all --events 200000

Steps (``all`` runs them in order): ``appends``, ``generate``, ``verify``, ``export``, ``search``,
``proofs`` (peak RSS and time of exports, an evidence pack and proofs, each in its own process).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "conductor_web.settings.local")
os.environ.setdefault("AUDIT_HMAC_KEY", "bench-audit-key")
# Not the deployment's published-heads file: the bench resets its log, which that file would flag.
os.environ.setdefault("AUDIT_STH_PUBLISH_PATH", "")
os.environ.setdefault("DEBUG", "false")

import django

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.utils import timezone  # noqa: E402

from apps.audit.chain import DIGEST_FIELDS  # noqa: E402
from apps.audit.events import AuditEventType  # noqa: E402
from apps.audit.models import AuditChainHead, AuditEvent  # noqa: E402
from apps.audit.sequencer import BATCH  # noqa: E402
from apps.audit.services import audit_record, hmac_key  # noqa: E402

EVENT_TYPES = [t for t in AuditEventType]
BENCH_TEAM_SLUG = "bench-a"


def say(msg: str) -> None:
    print(msg, flush=True)


def reset_audit_table() -> None:
    from apps.audit.apps import GUARD
    from apps.audit.models import SignedTreeHead

    table = AuditEvent._meta.db_table
    with connection.cursor() as cur:
        if connection.vendor == "postgresql":
            cur.execute(f"TRUNCATE {table}")
        else:
            GUARD["active"] = 0  # the SQLite append-only trigger: as manage.py flush does
            try:
                cur.execute(f"DELETE FROM {table}")
            finally:
                GUARD["active"] = 1
    AuditChainHead.objects.all().delete()
    SignedTreeHead.objects.all().delete()


WRITER_SCRIPT = """
import os, sys, time, uuid
sys.path.insert(0, os.getcwd())
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "conductor_web.settings.local")
import django
django.setup()
from django.db import transaction
from apps.audit.events import AuditEventType
from apps.audit.services import audit_batch, audit_record
from contextlib import nullcontext
n, per_tx, batched = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "batch"
from django.db import connection
with connection.cursor() as cur:
    cur.execute("SELECT pg_backend_pid()")
    backend = cur.fetchone()[0]
def backend_cpu():  # the writer's PostgreSQL backend, on this machine (loopback): utime + stime
    fields = open(f"/proc/{backend}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
print("ready", flush=True)
sys.stdin.readline()  # the start signal: every writer is imported and connected by then
began, cpu0, pg0 = time.time(), time.process_time(), backend_cpu()
for t in range(n // per_tx):
    run_id = uuid.uuid4()  # one transaction = one step boundary of one run
    # batch: as the run sink writes a step boundary (audit_batch: one multi-row INSERT)
    with transaction.atomic(), (audit_batch() if batched else nullcontext()):
        for i in range(per_tx):
            audit_record(
                event_type=AuditEventType.RUN_STEP_FINISHED, team=1, object_type="runs.run",
                object_id=str(run_id), run_id=run_id, policy_version_id=1,
                payload={"index": i, "status": "succeeded", "tokens": {"input": 12, "output": 34},
                         "output": {"sha256": "ab" * 32, "chars": 120}},
            )
print(began, time.time(), time.process_time() - cpu0, backend_cpu() - pg0, flush=True)
"""


def bench_append_processes(n: int, processes: int, per_tx: int, batched: bool = False) -> None:
    """``processes`` writer processes, ``per_tx`` audit rows per transaction, while this process
    runs the sequencer (as the deployment's one sequencer would) and records how far it lags."""
    import subprocess

    from apps.audit.sequencer import audit_flush, sequence_pass, sequencer_lag

    per = n // processes // per_tx * per_tx
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER_SCRIPT, str(per), str(per_tx), "batch" if batched else "row"],
            cwd=Path(__file__).resolve().parents[1],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    for p in procs:  # wait until each writer has imported Django and connected
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    sequenced, max_pending = 0, 0
    while any(p.poll() is None for p in procs):
        done = sequence_pass(wait=True)
        sequenced += max(done, 0)
        if done < BATCH:
            max_pending = max(max_pending, sequencer_lag().pending)
            time.sleep(0.005)  # the deployment's sequencer polls too
    times = [[float(x) for x in p.communicate()[0].split()] for p in procs]
    elapsed = max(t[1] for t in times) - min(t[0] for t in times)
    pending_at_end = sequencer_lag().pending
    total = per * processes
    cpu_us = (sum(t[2] for t in times) + sum(t[3] for t in times)) / total * 1e6
    say(
        f"appends[{connection.vendor}] {processes} writer processes x {per_tx} rows/transaction"
        f"{' (audit_batch)' if batched else ''}: "
        f"{total} rows in {elapsed:.2f}s = {total / elapsed:,.0f} rows/s "
        f"({total / per_tx / elapsed:,.0f} commits/s)"
    )
    say(
        f"  CPU per row: {cpu_us:,.0f} µs (writer Python {sum(t[2] for t in times) / total * 1e6:,.0f} + "
        f"its backend {sum(t[3] for t in times) / total * 1e6:,.0f}) -> CPU-bound ceiling on "
        f"{os.cpu_count()} idle cores ~{(os.cpu_count() or 1) / cpu_us * 1e6:,.0f} rows/s"
    )
    say(
        f"  sequencer alongside: {sequenced} rows numbered while writing, "
        f"max pending seen {max_pending}, pending when writers finished {pending_at_end}"
    )
    started = time.perf_counter()
    rest = audit_flush()
    took = time.perf_counter() - started
    if rest:
        say(f"  then the rest: {rest} rows in {took:.2f}s = {rest / took:,.0f} rows/s")


def bench_appends(
    n: int,
    threads: int,
    processes: int = 8,
    per_tx: tuple[int, ...] = (1,),
    modes: tuple[str, ...] = ("row",),
) -> None:
    reset_audit_table()
    AuditChainHead.objects.get_or_create(pk=1)
    # Baseline: the cheapest durable write (one row UPDATE + COMMIT) — the disk's commit latency.
    start = time.perf_counter()
    for _ in range(n):
        with transaction.atomic():
            AuditChainHead.objects.filter(pk=1).update(last_verify_message="")
    elapsed = time.perf_counter() - start
    say(f"baseline[{connection.vendor}] 1-row UPDATE+COMMIT: {n / elapsed:,.0f}/s")
    start = time.perf_counter()
    for i in range(n):
        with transaction.atomic():
            audit_record(
                event_type=AuditEventType.POOL_UPDATED, payload={"i": i}, before={"a": 1}, after={"a": 2}
            )
    elapsed = time.perf_counter() - start
    say(f"appends[{connection.vendor}] 1 writer: {n} events in {elapsed:.2f}s = {n / elapsed:,.0f}/s")
    from apps.audit.sequencer import audit_flush

    audit_flush()
    if processes >= 1:
        for mode in modes:
            for k in per_tx:
                bench_append_processes(n * k, processes, k, batched=mode == "batch")
    if threads > 1:
        per = n // threads
        barrier = threading.Barrier(threads)

        def writer() -> None:
            barrier.wait()
            for i in range(per):
                with transaction.atomic():
                    audit_record(event_type=AuditEventType.POOL_UPDATED, payload={"i": i})
            connection.close()

        ts = [threading.Thread(target=writer) for _ in range(threads)]
        start = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        elapsed = time.perf_counter() - start
        say(
            f"appends[{connection.vendor}] {threads} writers: {per * threads} events in {elapsed:.2f}s = {per * threads / elapsed:,.0f}/s"
        )


def bench_team() -> Any:
    from apps.governance.models import Role, Team
    from apps.governance.services import membership_set, team_create

    team = Team.objects.filter(slug=BENCH_TEAM_SLUG).first() or team_create(
        actor=None, slug=BENCH_TEAM_SLUG, name="Bench A"
    )
    from django.contrib.auth import get_user_model

    user, _ = get_user_model().objects.get_or_create(username="bench-reviewer")
    membership_set(actor=None, team=team, user=user, role=Role.REVIEWER)
    return team, user


def _backend_cpu() -> float:
    """CPU seconds of this connection's PostgreSQL backend (same machine), 0 on SQLite."""
    if connection.vendor != "postgresql":
        return 0.0
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        pid = cur.fetchone()[0]
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def generate(n: int) -> None:
    """Bulk-load ``n`` pending events, then let the real sequencer number, chain and hash them.

    PostgreSQL: COPY; SQLite: executemany (the ORM's bulk_create is ~10x slower at this size). The
    sequencing time is the sequencer's throughput on a large backlog (``audit_flush``).
    """
    import json

    from apps.audit.checkpoints import checkpoint_create
    from apps.audit.sequencer import audit_flush

    team, user = bench_team()
    reset_audit_table()
    rng = random.Random(7)
    start_time = timezone.now() - timedelta(days=90)
    step = timedelta(days=90) / n
    run_ids = [str(uuid.uuid4()) for _ in range(max(1, n // 12))]
    # Blank sequencing columns: Django's defaults are not database defaults.
    cols = [*(name for name in DIGEST_FIELDS if name != "seq"), "prev_digest", "leaf_hash", "colmac"]
    table = AuditEvent._meta.db_table
    started = time.perf_counter()

    def rows() -> Any:
        for i in range(1, n + 1):
            et = rng.choice(EVENT_TYPES)
            run_id = rng.choice(run_ids) if et.value.startswith("run.") else None
            by_user = rng.random() < 0.05
            yield [
                start_time + step * i,
                et.value,
                str(et.kind),
                user.pk if by_user else None,
                "bench-reviewer" if by_user else "system",
                None,
                "10.0.0.1",
                "bench",
                team.pk if rng.random() < 0.1 else 1000 + rng.randrange(20),
                "runs.run" if run_id else "workers.pool",
                run_id or str(rng.randrange(50)),
                "bench object",
                run_id,
                rng.randrange(1, 30),
                json.dumps(
                    {
                        "i": i,
                        "tokens": {"input": rng.randrange(1000), "output": rng.randrange(1000)},
                        "question": {"sha256": "ab" * 32, "chars": rng.randrange(5000)},
                        "status": "succeeded",
                    }
                ),
                "",
                "",
                "",
            ]

    with transaction.atomic(), connection.cursor() as cur:
        if connection.vendor == "postgresql":
            raw = cur.cursor  # psycopg 3 cursor
            with raw.copy(f"COPY {table} ({', '.join(cols)}) FROM STDIN") as copy:
                for row in rows():
                    copy.write_row(row)
        else:
            placeholders = ", ".join(["%s"] * len(cols))
            sql = f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({placeholders})"
            batch: list[Any] = []
            for row in rows():
                row[0] = connection.ops.adapt_datetimefield_value(row[0])  # as Django stores it
                batch.append(row)
                if len(batch) >= 10_000:
                    cur.executemany(sql, batch)
                    batch = []
            if batch:
                cur.executemany(sql, batch)
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            # As autovacuum would: without statistics the planner sorts the whole backlog per pass.
            cur.execute(f"ANALYZE {table}")
    loaded = time.perf_counter() - started
    say(f"generate[{connection.vendor}]: {n:,} pending events loaded in {loaded:.1f}s")
    started, cpu0, pg0 = time.perf_counter(), time.process_time(), _backend_cpu()
    sequenced = audit_flush()
    took = time.perf_counter() - started
    cpu, pg = time.process_time() - cpu0, _backend_cpu() - pg0
    say(
        f"sequencer[{connection.vendor}]: backlog of {sequenced:,} numbered in {took:.1f}s = "
        f"{sequenced / took:,.0f} rows/s (batches of {BATCH}); CPU {cpu:.1f}s Python + {pg:.1f}s "
        f"backend -> one sequencer on an idle core ~{sequenced / max(cpu + pg, 1e-9):,.0f} rows/s"
    )
    checkpoint_create()  # a signed checkpoint over the whole generated log, as the timer would leave
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute(f"VACUUM ANALYZE {table}")


def bench_verify(workers: int) -> None:
    import resource

    from apps.audit.verify import verify_and_record, verify_chain

    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for w in sorted({1, workers}):
        started = time.perf_counter()
        result = verify_chain(key=hmac_key(), workers=w)
        elapsed = time.perf_counter() - started
        say(
            f"verify[{connection.vendor}] {w} process(es): {result.summary()} in {elapsed:.1f}s = "
            f"{result.checked / elapsed:,.0f} events/s"
        )
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    say(f"  max RSS {rss_before / 1024:.0f} → {rss_after / 1024:.0f} MB")
    # Incremental: record a full verification, append 1000 events, verify only those.
    assert verify_and_record(key=hmac_key(), incremental=False).ok
    with transaction.atomic():
        for i in range(1000):
            audit_record(event_type=AuditEventType.POOL_UPDATED, payload={"i": i})
    from apps.audit.sequencer import audit_flush

    audit_flush()
    started = time.perf_counter()
    result = verify_and_record(key=hmac_key(), incremental=True)
    say(
        f"verify[{connection.vendor}] incremental (+1000 events): {result.summary()} in {time.perf_counter() - started:.2f}s"
    )


def bench_export(limit: int | None) -> None:
    from apps.audit.export import export_chunks

    qs = AuditEvent.objects.all()
    if limit:
        head = AuditChainHead.objects.get(pk=1).seq
        qs = qs.filter(seq__gt=head - limit)
    for fmt in ("jsonl", "csv"):
        started = time.perf_counter()
        size = rows = 0
        for chunk in export_chunks(qs, fmt):
            size += len(chunk)
            rows += chunk.count(b"\n")
        elapsed = time.perf_counter() - started
        say(
            f"export[{connection.vendor}] {fmt}: ~{rows:,} rows, {size / 1e6:,.0f} MB in {elapsed:.1f}s = "
            f"{rows / elapsed:,.0f} rows/s, {size / 1e6 / elapsed:.1f} MB/s"
        )


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _measure_in_child(name: str, work: Any) -> None:
    """Run ``work`` in a forked child: its own peak RSS (ru_maxrss) and time, from a known start."""
    import multiprocessing
    import resource

    from django.db import connections

    def child(queue: Any) -> None:
        start_rss = _rss_mb()
        started, cpu = time.perf_counter(), time.process_time()
        detail = work()
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        queue.put((start_rss, peak, elapsed, cpu, detail))
        connections.close_all()

    connections.close_all()
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=child, args=(queue,))
    proc.start()
    start_rss, peak, elapsed, cpu, detail = queue.get()
    proc.join()
    say(
        f"proofs[{connection.vendor}] {name}: {detail}; {elapsed:.1f}s wall ({cpu:.1f}s CPU), "
        f"RSS {start_rss:.0f} MB at start, peak {peak:.0f} MB"
    )


def bench_proofs(baseline: bool) -> None:
    """Exports, evidence packs and consistency proofs in bounded memory (issue 40), each in its
    own process so its peak RSS is its own. ``baseline``: also the whole tree in memory, as
    exports built it before (``merkle.Tree`` over every leaf)."""
    from apps.audit import merkle
    from apps.audit.evidence import Scope, pack_chunks
    from apps.audit.export import export_chunks
    from apps.audit.proofs import StreamedTree, consistency_proof

    size = AuditChainHead.objects.get(pk=1).seq
    team, _ = bench_team()

    def drain(chunks: Any) -> str:
        total = lines = 0
        for chunk in chunks:
            total += len(chunk)
            lines += chunk.count(b"\n")
        return f"{lines:,} lines, {total / 1e6:,.0f} MB"

    if baseline:

        def whole_tree() -> str:
            leaves = [
                bytes.fromhex(h)
                for h in AuditEvent.objects.order_by("seq")
                .values_list("leaf_hash", flat=True)
                .iterator(chunk_size=20_000)
            ]
            tree = merkle.Tree(leaves)
            tree.inclusion_proof(size // 2)
            return f"merkle.Tree over {len(leaves):,} leaves (the export's tree before)"

        _measure_in_child("baseline: whole tree in memory", whole_tree)

    def streamed() -> str:
        tree = StreamedTree(size)
        proof = tree.inclusion_proof(size // 2)
        return f"root and a {len(proof)}-hash proof over {size:,} leaves"

    _measure_in_child("streamed tree (root + one proof)", streamed)
    _measure_in_child(
        "consistency proof (a witness submission)",
        lambda: f"{len(consistency_proof(size // 2 + 1, size))} hashes from {size // 2 + 1:,} to {size:,}",
    )
    team_qs = AuditEvent.objects.filter(team_id=team.pk)
    _measure_in_child("export jsonl, one team (~10%)", lambda: drain(export_chunks(team_qs, "jsonl")))
    _measure_in_child(
        "export jsonl, whole log", lambda: drain(export_chunks(AuditEvent.objects.all(), "jsonl"))
    )
    _measure_in_child("export csv, whole log", lambda: drain(export_chunks(AuditEvent.objects.all(), "csv")))
    scope = Scope(
        title=f"team {team.slug}",
        filters={"team": team.slug},
        retention=[(team.slug, None)],
        requested_by="bench",
        export_seq=size + 1,
    )
    _measure_in_child(
        "evidence pack, one team (~10%)",
        lambda: drain(pack_chunks(team_qs, scope)).replace("lines", "zip lines"),
    )


def _median_ms(fn: Any, repeat: int = 5) -> float:
    fn()  # warm
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def bench_search(explain: bool) -> None:
    from django.contrib.auth import get_user_model
    from django.test import Client

    from apps.audit.filters import filter_audit_events
    from apps.audit.selectors import page_of_events

    _team, reviewer = bench_team()
    superuser, _ = get_user_model().objects.get_or_create(
        username="bench-admin", defaults={"is_superuser": True, "is_staff": True}
    )
    head = AuditChainHead.objects.get(pk=1).seq
    run_id = AuditEvent.objects.filter(run_id__isnull=False).values_list("run_id", flat=True).first()
    mid = AuditEvent.objects.filter(seq=head // 2).values_list("created_at", flat=True).first()
    assert mid is not None
    cases = {
        "superuser, no filter, page 1": (superuser, {}, None),
        "superuser, page at seq/2 (keyset)": (superuser, {}, head // 2),
        "superuser, type=run.finished": (superuser, {"type": "run.finished"}, None),
        "superuser, type prefix policy.": (superuser, {"type": "policy."}, None),
        "superuser, run=<id>": (superuser, {"run": str(run_id)}, None),
        "superuser, 1-day window mid-range": (
            superuser,
            {"since": mid.isoformat(), "until": (mid + timedelta(days=1)).isoformat()},
            None,
        ),
        "superuser, actor=bench-reviewer": (superuser, {"actor": "bench-reviewer"}, None),
        "reviewer (team visibility), page 1": (reviewer, {}, None),
        "reviewer, type=run.finished": (reviewer, {"type": "run.finished"}, None),
        "reviewer, page at seq/2": (reviewer, {}, head // 2),
        "superuser, object=workers.pool:7": (superuser, {"object": "workers.pool:7"}, None),
    }
    say(f"search[{connection.vendor}] at {head:,} events (median of 5, one page of 50):")
    for label, (user, params, before) in cases.items():
        qs = filter_audit_events(AuditEvent.objects.visible_to(user, "view"), params)
        ms = _median_ms(lambda qs=qs, before=before: page_of_events(qs, before=before))
        say(f"  {label:45s} {ms:8.1f} ms")
        if explain and connection.vendor == "postgresql":
            q = qs.filter(seq__lt=before) if before else qs
            plan = q.order_by("-seq")[:51].explain()
            first = [line.strip() for line in plan.splitlines() if "Scan" in line][:2]
            say(f"      plan: {' | '.join(first)}")
    client = Client()
    for label, user in (("superuser", superuser), ("reviewer", reviewer)):
        client.force_login(user)
        ms = _median_ms(lambda: client.get("/audit/"))
        ms_f = _median_ms(lambda: client.get("/audit/", {"type": "run.finished"}))
        say(f"  GET /audit/ as {label:10s} {ms:8.1f} ms; with type=run.finished {ms_f:8.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "step", choices=["all", "appends", "generate", "verify", "export", "search", "proofs"]
    )
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--appends", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=0, help="also N writer threads in one process")
    parser.add_argument("--processes", type=int, default=8, help="writer processes (PostgreSQL)")
    parser.add_argument(
        "--per-tx",
        default="1",
        help="audit rows per writer transaction, comma-separated (1: commit-bound; a run's step "
        "boundary writes several); the 8-process run writes --appends x N rows for each N",
    )
    parser.add_argument(
        "--mode",
        default="row",
        help="writer transactions: row (one INSERT per audit_record), batch (inside audit_batch(), "
        "one multi-row INSERT per transaction, as the run sink writes), or row,batch",
    )
    parser.add_argument("--workers", type=int, default=2, help="verify processes")
    parser.add_argument("--export-limit", type=int, default=None)
    parser.add_argument("--explain", action="store_true")
    parser.add_argument(
        "--baseline", action="store_true", help="proofs: also the whole tree in memory (before)"
    )
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    say(f"database: {connection.vendor} {connection.settings_dict['NAME']}")
    if args.step in ("all", "appends"):
        pg = connection.vendor == "postgresql"
        per_tx = tuple(int(k) for k in str(args.per_tx).split(","))
        modes = tuple(str(args.mode).split(","))
        bench_appends(args.appends, args.threads if pg else 1, args.processes if pg else 0, per_tx, modes)
    if args.step in ("all", "generate"):
        generate(args.events)
    if args.step in ("all", "verify"):
        bench_verify(args.workers)
    if args.step in ("all", "export"):
        bench_export(args.export_limit)
    if args.step in ("all", "search"):
        bench_search(args.explain)
    if args.step in ("all", "proofs"):
        bench_proofs(args.baseline)


if __name__ == "__main__":
    main()
