"""Proofs in bounded memory (issue 40): the streamed tree equals the published RFC 6962 answers
and the in-memory tree, reads one chunk of leaves at a time, and exports use it."""

from __future__ import annotations

import secrets
from typing import Any

import pytest

from apps.audit import merkle, proofs
from apps.audit.proofs import StreamedTree
from tests.audit.offline import verify_offline
from tests.audit.test_vectors import LEAF_INPUTS, ROOTS
from tests.factories.audit import append_events


def test_the_streamed_tree_gives_the_published_roots_and_the_in_memory_proofs() -> None:
    leaves = [merkle.leaf_hash(bytes.fromhex(x)) for x in LEAF_INPUTS]
    for size in range(1, 9):
        for chunk in (1, 2, 4, 1 << 16):
            assert StreamedTree(size, chunk=chunk, leaves=leaves).root().hex() == ROOTS[size]
    for size in (1, 2, 3, 5, 8, 13, 31, 32, 33, 100):
        many = [merkle.leaf_hash(secrets.token_bytes(4)) for _ in range(size)]
        reference = merkle.Tree(many)
        for chunk in (1, 4, 16):
            tree = StreamedTree(size, chunk=chunk, leaves=many)
            assert tree.root() == reference.root()
            assert all(tree.inclusion_proof(i) == reference.inclusion_proof(i) for i in range(size))
            assert all(
                tree.consistency_proof(m) == reference.consistency_proof(m) for m in range(1, size + 1)
            )


@pytest.mark.django_db
def test_an_export_reads_the_leaves_a_chunk_at_a_time(
    client: Any, superuser: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """No read of more than one chunk of leaves is ever held: one streamed pass (consumed as
    it comes) for the chunk roots, then the chunks holding exported rows, each once."""
    monkeypatch.setattr(proofs, "CHUNK", 8)
    reads: list[tuple[int, int]] = []
    real = proofs._leaf_hashes

    def recording(start: int, end: int) -> Any:
        reads.append((start, end))
        return real(start, end)

    monkeypatch.setattr(proofs, "_leaf_hashes", recording)
    append_events(45)
    client.force_login(superuser)
    response = client.get("/audit/export.jsonl")
    assert response.status_code == 200
    body = b"".join(response.streaming_content)
    assert body.count(b'"proof"') == 45
    # 46 leaves with the export's own record: one pass over the full chunks, the partial last
    # chunk once, then each full chunk once, in order.
    assert reads == [(0, 40), (40, 46), (0, 8), (8, 16), (16, 24), (24, 32), (32, 40)]
    (tmp_path / "e.jsonl").write_bytes(body)
    assert verify_offline(tmp_path / "e.jsonl", "--contiguous").returncode == 0
