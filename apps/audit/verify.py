"""Walk the audit chain and say whether it is intact, and if not, where and how it broke.

The walk streams rows in ``seq`` order (constant memory at millions of rows) and checks for each:

* its ``seq`` follows the previous one (a gap means rows were **deleted**);
* its ``prev_digest`` is the previous row's digest (the link);
* its digest is the HMAC of its own content and ``prev_digest`` (the content).

At the first failure it looks a little around the row to name the kind of damage:

* ``edited``    — the content no longer matches the digest but the links around it are intact;
* ``deleted``   — a sequence number is missing (or the tail is shorter than the chain head);
* ``reordered`` — the row links to a row that exists elsewhere in the chain (rows were swapped);
* ``inserted``  — a forged row: its digest does not verify and the chain continues as if it were
  not there (or it sits beyond the recorded chain head);
* ``rewritten`` — the chain verifies but its digest at a checkpoint's ``seq`` is not the
  checkpoint's, i.e. someone holding the HMAC key recomputed history.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from apps.audit.chain import DIGEST_FIELDS, GENESIS_DIGEST, compute_digest
from apps.audit.models import AuditChainHead, AuditEvent

# The columns a walk needs, in a fixed order (values_list is far cheaper than model instances).
ROW_FIELDS = (*DIGEST_FIELDS, "prev_digest", "digest")
CHUNK_SIZE = 5000

EDITED, DELETED, REORDERED, INSERTED, REWRITTEN = "edited", "deleted", "reordered", "inserted", "rewritten"


@dataclass(frozen=True)
class Checkpoint:
    seq: int
    digest: str
    created_at: str = ""

    @classmethod
    def load(cls, path: str | Path) -> Checkpoint:
        data = json.loads(Path(path).read_text())
        try:
            return cls(
                seq=int(data["seq"]), digest=str(data["digest"]), created_at=str(data.get("created_at", ""))
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path} is not an audit checkpoint (needs seq and digest): {exc}") from exc


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    checked: int
    last_seq: int
    broken_seq: int | None = None
    reason: str = ""
    message: str = ""

    def summary(self) -> str:
        if self.ok:
            return f"audit chain intact: {self.checked} events verified up to seq {self.last_seq}"
        return f"audit chain BROKEN at seq {self.broken_seq}: {self.reason} — {self.message}"


def row_content(row: dict[str, Any]) -> dict[str, Any]:
    """The digest-covered content of a row as read back (mirrors services.event_content)."""
    return {
        "seq": row["seq"],
        "created_at": row["created_at"],
        "event_type": row["event_type"],
        "kind": row["kind"],
        "actor_id": row["actor_id"],
        "actor_label": row["actor_label"],
        "api_key_id": row["api_key_id"],
        "ip": row["ip"],
        "user_agent": row["user_agent"],
        "team_id": row["team_id"],
        "object_type": row["object_type"],
        "object_id": row["object_id"],
        "object_repr": row["object_repr"],
        "run_id": str(row["run_id"]) if row["run_id"] else None,
        "policy_version_id": row["policy_version_id"],
        "payload": row["payload"],
    }


def _rows(qs: Any) -> Iterator[dict[str, Any]]:
    for values in qs.values_list(*ROW_FIELDS).iterator(chunk_size=CHUNK_SIZE):
        yield dict(zip(ROW_FIELDS, values, strict=True))


def _row_at(**lookup: Any) -> dict[str, Any] | None:
    values = AuditEvent.objects.filter(**lookup).order_by("seq").values_list(*ROW_FIELDS).first()
    return dict(zip(ROW_FIELDS, values, strict=True)) if values else None


def _digest_ok(key: bytes, row: dict[str, Any], *, as_seq: int | None = None) -> bool:
    content = row_content(row)
    if as_seq is not None:
        content["seq"] = as_seq
    return compute_digest(key, content, row["prev_digest"]) == row["digest"]


def _diagnose(
    key: bytes, row: dict[str, Any], expected_seq: int, expected_prev: str, head_digest: str
) -> VerifyResult:
    """Name the damage at the first row that fails (only runs on failure, so it may query)."""
    seq = row["seq"]
    checked = expected_seq - 1
    if seq > expected_seq:
        missing = f"{expected_seq}" if seq == expected_seq + 1 else f"{expected_seq}-{seq - 1}"
        return VerifyResult(
            False, checked, checked, expected_seq, DELETED, f"seq {missing} missing (next row is seq {seq})"
        )

    content_ok = _digest_ok(key, row)
    link_ok = row["prev_digest"] == expected_prev
    if content_ok and link_ok:  # pragma: no cover - callers only diagnose failures
        return VerifyResult(True, seq, seq)

    # Does the row link to some other existing row? Then rows were moved (swapped seqs or contents).
    if not link_ok:
        target = _row_at(digest=row["prev_digest"])
        if target is not None:
            belongs = target["seq"] + 1
            return VerifyResult(
                False,
                checked,
                checked,
                seq,
                REORDERED,
                f"row at seq {seq} links to seq {target['seq']} instead of seq {expected_seq - 1}"
                + (f" (it verifies as seq {belongs})" if _digest_ok(key, row, as_seq=belongs) else ""),
            )
        if content_ok:
            return VerifyResult(
                False,
                checked,
                checked,
                seq,
                DELETED,
                f"row at seq {seq} links to a digest no longer in the chain (a row before it was removed)",
            )

    nxt = _row_at(seq__gt=seq)
    if nxt is None:
        if row["digest"] != head_digest:
            return VerifyResult(
                False,
                checked,
                checked,
                seq,
                INSERTED,
                f"forged row at seq {seq}: its digest does not verify and the chain head does not know it",
            )
        return VerifyResult(
            False, checked, checked, seq, EDITED, f"content of seq {seq} does not match its digest"
        )
    if nxt["prev_digest"] == row["digest"] and link_ok:
        return VerifyResult(
            False,
            checked,
            checked,
            seq,
            EDITED,
            f"content of seq {seq} does not match its digest (links intact)",
        )
    if nxt["prev_digest"] == expected_prev:
        return VerifyResult(
            False,
            checked,
            checked,
            seq,
            INSERTED,
            f"forged row at seq {seq}: its digest does not verify and seq {nxt['seq']} links past it",
        )
    return VerifyResult(
        False,
        checked,
        checked,
        seq,
        EDITED,
        f"seq {seq} does not match its digest and the next row does not link to it",
    )


def verify_chain(*, key: bytes, checkpoint: Checkpoint | None = None) -> VerifyResult:
    """Walk the whole chain. Read-only; see ``verify_and_record`` to store the outcome."""
    # PostgreSQL: one transaction so the server-side cursor streams (no WITH HOLD materialisation)
    # from one snapshot. SQLite: no transaction — an IMMEDIATE one would block every writer.
    ctx = transaction.atomic() if connection.vendor == "postgresql" else contextlib.nullcontext()
    with ctx:
        head = AuditChainHead.objects.filter(pk=1).values_list("seq", "digest").first() or (0, GENESIS_DIGEST)
        expected_seq, expected_prev = 1, GENESIS_DIGEST
        checkpoint_seen = False
        for row in _rows(AuditEvent.objects.order_by("seq")):
            if not (
                row["seq"] == expected_seq and row["prev_digest"] == expected_prev and _digest_ok(key, row)
            ):
                return _diagnose(key, row, expected_seq, expected_prev, head[1])
            if checkpoint is not None and row["seq"] == checkpoint.seq:
                checkpoint_seen = True
                if row["digest"] != checkpoint.digest:
                    return VerifyResult(
                        False,
                        row["seq"],
                        row["seq"],
                        row["seq"],
                        REWRITTEN,
                        f"digest at seq {row['seq']} differs from the checkpoint taken {checkpoint.created_at or '(no time)'}: "
                        "history up to it was recomputed",
                    )
            expected_seq, expected_prev = row["seq"] + 1, row["digest"]
        last = expected_seq - 1
        # Re-read the head: appends that committed during the walk moved it forward legitimately.
        head_now = AuditChainHead.objects.filter(pk=1).values_list("seq", "digest").first() or (
            0,
            GENESIS_DIGEST,
        )
    if last < head[0]:
        return VerifyResult(
            False, last, last, last + 1, DELETED, f"chain ends at seq {last} but its head is seq {head[0]}"
        )
    if last > head_now[0]:
        return VerifyResult(
            False,
            head_now[0],
            head_now[0],
            head_now[0] + 1,
            INSERTED,
            f"rows beyond the chain head (seq {head_now[0]})",
        )
    if last == head_now[0] and last and expected_prev != head_now[1]:
        return VerifyResult(
            False,
            last - 1,
            last - 1,
            last,
            EDITED,
            f"last row's digest differs from the chain head's at seq {last}",
        )
    if checkpoint is not None and not checkpoint_seen:
        return VerifyResult(
            False,
            last,
            last,
            last + 1,
            DELETED,
            f"chain ends at seq {last}, before the checkpoint at seq {checkpoint.seq}",
        )
    return VerifyResult(True, last, last)


def verify_and_record(*, key: bytes, checkpoint: Checkpoint | None = None) -> VerifyResult:
    """Verify and store the outcome on the chain head row (which the UI shows)."""
    result = verify_chain(key=key, checkpoint=checkpoint)
    AuditChainHead.objects.get_or_create(pk=1)
    AuditChainHead.objects.filter(pk=1).update(
        last_verified_at=timezone.now(),
        last_verified_ok=result.ok,
        last_verified_seq=result.last_seq if result.ok else (result.broken_seq or 0),
        last_verify_message=result.summary()[:2000],
    )
    return result
