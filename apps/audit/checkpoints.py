"""The log's identity and its checkpoints: sign the tree head (c2sp.org/tlog-checkpoint), have
witnesses cosign it, publish it outside the database, keyed by origin.

A checkpoint is signed after a flush, over the head the sequencer keeps (size and Merkle
frontier), and reused while the tree does not grow. ``checkpoint_publish`` (the sequencer's
timer in the embedded server, Celery beat in the distributed mode) also submits it to the
configured witnesses (``apps.audit.witnessing``) and appends it, with their cosignatures, as
one JSON line to ``AUDIT_STH_PUBLISH_PATH``.
"""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction

from apps.audit import merkle, notes, witnessing
from apps.audit.logkeys import log_signer
from apps.audit.models import AuditChainHead, Cosignature, LogIdentity, SignedTreeHead
from apps.audit.sequencer import audit_flush


def log_origin() -> str:
    """This log's origin, created with the log: ``<AUDIT_LOG_NAME>/<16 hex digits>``."""
    origin = LogIdentity.objects.filter(pk=1).values_list("origin", flat=True).first()
    if origin:
        return origin
    name = str(settings.AUDIT_LOG_NAME).strip().strip("/")
    if not notes.valid_name(name):
        raise ImproperlyConfigured(f"AUDIT_LOG_NAME {name!r} must be non-empty, without spaces or '+'")
    with transaction.atomic():  # two processes racing: get_or_create keeps the first
        row, _ = LogIdentity.objects.get_or_create(
            pk=1, defaults={"origin": f"{name}/{secrets.token_hex(8)}"}
        )
    return row.origin


def checkpoint_create() -> SignedTreeHead:
    """Sign the current head (after a flush); the latest checkpoint when the tree has not grown."""
    audit_flush()
    origin = log_origin()
    with transaction.atomic():
        AuditChainHead.objects.get_or_create(pk=1)
        # The head row's lock (the sequencer takes it too, briefly) makes two publishers (the
        # timer, a manual audit_checkpoint) sign one checkpoint per size, not two.
        head = AuditChainHead.objects.select_for_update().get(pk=1)
        latest = (
            SignedTreeHead.objects.filter(origin=origin)
            .exclude(note="")
            .order_by("-tree_size", "-id")
            .first()
        )
        if latest is not None and latest.tree_size == head.seq:
            return latest
        root = merkle.frontier_root(list(head.frontier or []))
        body = notes.Checkpoint(origin, head.seq, root).text
        return SignedTreeHead.objects.create(
            origin=origin,
            tree_size=head.seq,
            root_hash=root.hex(),
            timestamp_ms=int(time.time() * 1000),
            note=body + "\n" + log_signer(origin).signature_line(body),
        )


def served_note(sth: SignedTreeHead) -> str:
    """The checkpoint with every cosignature collected for it (what tooling and auditors get)."""
    lines = list(
        Cosignature.objects.filter(checkpoint=sth)
        .order_by("witness", "key_id")
        .values_list("line", flat=True)
    )
    return sth.note + "".join(lines)


def latest_checkpoint() -> SignedTreeHead | None:
    return (
        SignedTreeHead.objects.filter(origin=log_origin())
        .exclude(note="")
        .order_by("-tree_size", "-id")
        .first()
    )


def witnessed_checkpoints(up_to: int) -> list[SignedTreeHead]:
    """For each witness, the largest checkpoint (size <= ``up_to``) it cosigned."""
    origin = log_origin()
    rows = (
        Cosignature.objects.filter(checkpoint__origin=origin, checkpoint__tree_size__lte=up_to)
        .order_by("witness", "key_id", "-checkpoint__tree_size")
        .values_list("witness", "key_id", "checkpoint_id")
    )
    best: dict[tuple[str, str], int] = {}
    for witness, key_id, checkpoint_id in rows:
        best.setdefault((witness, key_id), checkpoint_id)
    return list(SignedTreeHead.objects.filter(pk__in=set(best.values())).order_by("tree_size"))


def publish_path() -> Path | None:
    raw = str(getattr(settings, "AUDIT_STH_PUBLISH_PATH", "") or "")
    return Path(raw) if raw else None


def checkpoint_publish() -> SignedTreeHead:
    """Sign the head, collect the witnesses' cosignatures, append it to ``AUDIT_STH_PUBLISH_PATH``.

    Point that path at write-once storage (an append-only mount, ``chattr +a``, an object-lock
    bucket sync): verify compares the database with the last line of its own origin there, which
    catches a deleted tail together with a rolled-back head.
    """
    sth = checkpoint_create()
    witnessing.collect_cosignatures(sth)
    path = publish_path()
    if path is None or sth.published:
        return sth
    line: dict[str, Any] = {**sth.as_dict(), "checkpoint": served_note(sth)}
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(line, sort_keys=True) + "\n")
    SignedTreeHead.objects.filter(pk=sth.pk).update(published=True)
    return sth
