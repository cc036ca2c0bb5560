"""Merkle proofs over the stored leaf hashes (RFC 9162): inclusion for exports, consistency
between checkpoints. Reads only ``leaf_hash`` (64 hex chars a row), streamed."""

from __future__ import annotations

from apps.audit import merkle
from apps.audit.models import AuditEvent


def load_tree(size: int) -> merkle.Tree:
    leaves = [
        bytes.fromhex(h)
        for h in AuditEvent.objects.filter(seq__gte=1, seq__lte=size)
        .order_by("seq")
        .values_list("leaf_hash", flat=True)
        .iterator(chunk_size=20_000)
    ]
    if len(leaves) != size:
        raise ValueError(f"the log holds {len(leaves)} sequenced events, not {size}")
    return merkle.Tree(leaves)


def consistency_proof(first: int, second: int) -> list[bytes]:
    if first == 0 or first == second:
        return []
    return load_tree(second).consistency_proof(first, second)
