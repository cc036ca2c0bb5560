"""Factories/helpers for audit tests: runs to review or erase, and chains to tamper with."""

from __future__ import annotations

from typing import Any

from django.db import connection, transaction

from apps.audit.events import AuditEventType
from apps.audit.models import AuditEvent
from apps.audit.services import audit_flush, audit_record
from apps.runs.models import Run, RunEvent, RunStatus, Step
from apps.workers.models import Pool


def make_pool(team: Any, slug: str = "audit-pool") -> Pool:
    # A bare pool row: review and retention never execute the run, so no workers are needed.
    pool, _ = Pool.objects.get_or_create(slug=slug, defaults={"team": team, "name": slug})
    return pool


def make_run(
    team: Any,
    *,
    created_by: Any = None,
    question: str = "What is 2+2?",
    answer: str = "4",
    status: str = RunStatus.SUCCEEDED,
    **fields: Any,
) -> Run:
    return Run.objects.create(
        team=team,
        pool=make_pool(team),
        created_by=created_by,
        question=question,
        answer=answer,
        status=status,
        **fields,
    )


def add_steps_and_events(run: Run, *, instruction: str, output: str) -> None:
    Step.objects.create(
        run=run,
        index=0,
        worker_key="w1",
        instruction=instruction,
        output=output,
        messages=[{"role": "user", "content": instruction}],
        status="succeeded",
    )
    RunEvent.objects.create(
        run=run, seq=1, type="run.started", data={"question": run.question, "strategy": "conductor"}
    )
    RunEvent.objects.create(
        run=run,
        seq=2,
        type="step.finished",
        data={"index": 0, "status": "succeeded", "output": output, "usage": {"input_tokens": 3}},
    )
    RunEvent.objects.create(
        run=run, seq=3, type="run.finished", data={"status": "succeeded", "answer": run.answer}
    )


def append_events(
    n: int, *, team: Any = None, event_type: AuditEventType = AuditEventType.TEAM_UPDATED, **kwargs: Any
) -> list[AuditEvent]:
    with transaction.atomic():  # audit_record refuses to run outside one (issue #16)
        events = [
            audit_record(event_type=event_type, team=team, payload={"i": i, "note": f"event {i}"}, **kwargs)
            for i in range(n)
        ]
    audit_flush()  # number them now: callers assert on seq and digests
    by_id = AuditEvent.objects.in_bulk([e.pk for e in events])
    return [by_id[e.pk] for e in events]


class Tamper:
    """Raw-SQL edits of ``audit_auditevent``, as an attacker with database rights would make.

    The append-only triggers are disabled first (a DB superuser can: ALTER TABLE on PostgreSQL,
    DROP TRIGGER on SQLite); the test's transaction rolls that back.
    """

    table = AuditEvent._meta.db_table

    def __enter__(self) -> Tamper:
        with connection.cursor() as cur:
            if connection.vendor == "postgresql":
                cur.execute(f"ALTER TABLE {self.table} DISABLE TRIGGER audit_auditevent_append_only")
            else:
                cur.execute(
                    "SELECT sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = %s", [self.table]
                )
                self._sqlite_triggers = [r[0] for r in cur.fetchall()]
                for name in ("audit_auditevent_no_delete", "audit_auditevent_no_update"):
                    cur.execute(f"DROP TRIGGER IF EXISTS {name}")
        return self

    def __exit__(self, *exc: object) -> None:
        with connection.cursor() as cur:
            if connection.vendor == "postgresql":
                cur.execute(f"ALTER TABLE {self.table} ENABLE TRIGGER audit_auditevent_append_only")
            else:
                for sql in self._sqlite_triggers:
                    cur.execute(sql)

    def sql(self, statement: str, params: list[Any] | tuple[Any, ...] = ()) -> None:
        with connection.cursor() as cur:
            cur.execute(statement.replace("{t}", self.table), params)

    @property
    def _json(self) -> str:
        return "%s::jsonb" if connection.vendor == "postgresql" else "%s"

    def set_payload(self, seq: int, payload_json: str) -> None:
        self.sql(f"UPDATE {{t}} SET payload = {self._json} WHERE seq = %s", [payload_json, seq])

    def delete(self, seq: int) -> None:
        self.sql("DELETE FROM {t} WHERE seq = %s", [seq])

    def swap(self, a: int, b: int) -> None:
        """Exchange the seqs of two rows (unique constraint: via a temporary value)."""
        temp = 10**12
        self.sql("UPDATE {t} SET seq = %s WHERE seq = %s", [temp, a])
        self.sql("UPDATE {t} SET seq = %s WHERE seq = %s", [a, b])
        self.sql("UPDATE {t} SET seq = %s WHERE seq = %s", [b, temp])

    def shift_from(self, seq: int) -> None:
        """Make room at ``seq`` by renumbering every later row up by one (highest first)."""
        with connection.cursor() as cur:
            cur.execute(f"SELECT seq FROM {self.table} WHERE seq >= %s ORDER BY seq DESC", [seq])
            seqs = [r[0] for r in cur.fetchall()]
        for s in seqs:
            self.sql("UPDATE {t} SET seq = %s WHERE seq = %s", [s + 1, s])

    def insert_copy(
        self, *, like_seq: int, seq: int, prev_digest: str, digest: str, payload_json: str
    ) -> None:
        """Insert a forged row modelled on an existing one."""
        cols = [
            f.column
            for f in AuditEvent._meta.concrete_fields
            if f.column not in ("id", "seq", "payload", "prev_digest", "digest")
        ]
        col_list = ", ".join(cols)
        self.sql(
            f"INSERT INTO {{t}} ({col_list}, seq, payload, prev_digest, digest) "
            f"SELECT {col_list}, %s, {self._json}, %s, %s FROM {{t}} WHERE seq = %s",
            [seq, payload_json, prev_digest, digest, like_seq],
        )
