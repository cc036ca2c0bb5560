"""Factories/helpers for audit tests: runs to review or erase, and chains to tamper with."""

from __future__ import annotations

from typing import Any

from django.db import connection, transaction

from apps.audit import merkle, notes
from apps.audit.chain import PG_CREATED_US, PG_DISPLAY_ROW, canonical_json, column_mac, compute_digest
from apps.audit.checkpoints import log_origin
from apps.audit.events import AuditEventType
from apps.audit.logkeys import log_signer
from apps.audit.models import AuditChainHead, AuditEvent, SignedTreeHead
from apps.audit.services import audit_flush, audit_record, event_content, hmac_key
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

    def rewrite_from(self, seq: int, payload_json: str, *, resign_witnessed: bool = True) -> None:
        """What an operator holding both keys (AUDIT_HMAC_KEY and AUDIT_SIGNING_KEY) can do: edit
        ``seq`` and recompute every digest, entry, Merkle leaf, column MAC and the head after it,
        then re-sign every checkpoint in the database over the rewritten tree (``resign_witnessed``
        False: not those a witness cosigned, which would carry a cosignature of another head).
        Only a head kept outside (a published file, an auditor's checkpoint, a witness) can tell."""
        key = hmac_key()
        self.set_payload(seq, payload_json)
        prev = AuditEvent.objects.filter(seq=seq - 1).values_list("digest", flat=True).first() or "0" * 64
        for event in AuditEvent.objects.filter(seq__gte=seq).order_by("seq"):
            digest = compute_digest(key, event_content(event), prev)
            entry = canonical_json(event_content(event)).encode()
            self.sql(
                "UPDATE {t} SET prev_digest = %s, digest = %s, leaf_hash = %s, entry = %s WHERE seq = %s",
                [prev, digest, merkle.leaf_hash(entry).hex(), entry, event.seq],
            )
            if connection.vendor == "postgresql":
                with connection.cursor() as cur:
                    cur.execute(
                        f"SELECT {PG_CREATED_US}, {PG_DISPLAY_ROW} FROM {self.table} WHERE seq = %s",
                        [event.seq],
                    )
                    created_us, display = cur.fetchone()
                mac = column_mac(key, digest, event.seq, created_us, bytes(display))
                self.sql("UPDATE {t} SET colmac = %s WHERE seq = %s", [mac, event.seq])
            prev = digest
        leaves = [
            bytes.fromhex(h) for h in AuditEvent.objects.order_by("seq").values_list("leaf_hash", flat=True)
        ]
        frontier: merkle.Frontier = []
        for leaf in leaves:
            frontier = merkle.frontier_append(frontier, leaf)
        AuditChainHead.objects.filter(pk=1).update(digest=prev, frontier=frontier)
        tree, origin = merkle.Tree(leaves), log_origin()
        rows = SignedTreeHead.objects.filter(origin=origin)
        if not resign_witnessed:
            rows = rows.filter(cosignatures__isnull=True)
        for sth in rows:
            body = notes.Checkpoint(origin, sth.tree_size, tree.root(sth.tree_size)).text
            note = body + "\n" + log_signer(origin).signature_line(body)
            SignedTreeHead.objects.filter(pk=sth.pk).update(
                root_hash=tree.root(sth.tree_size).hex(), note=note
            )
