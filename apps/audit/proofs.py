"""Merkle proofs over the stored leaf hashes (RFC 6962 / 9162) in bounded memory.

A ``StreamedTree`` never holds the whole tree: one streamed read of the leaf hashes keeps only
the root of each full chunk of ``CHUNK`` leaves (perfect subtrees, since chunks are aligned
powers of two) and the perfect subtrees above them; a proof's nodes inside a chunk come from
that chunk's leaves, read when first needed and kept while callers walk rows in seq order.
Memory is O(CHUNK + size / CHUNK) hashes: two chunks' trees (the current one and the partial
last one, ~9 MB each at most) plus 64 bytes per 65 536 events.
"""

from __future__ import annotations

from collections.abc import Iterator

from apps.audit import merkle
from apps.audit.models import AuditEvent

CHUNK = 1 << 16
READ_ROWS = 20_000


def _leaf_hashes(start: int, end: int) -> Iterator[bytes]:
    """Leaves ``start..end-1`` (0-based; seq = index + 1), streamed; a missing row is an error."""
    expected = start
    qs = (
        AuditEvent.objects.filter(seq__gt=start, seq__lte=end).order_by("seq").values_list("seq", "leaf_hash")
    )
    for seq, leaf in qs.iterator(chunk_size=READ_ROWS):
        if seq != expected + 1 or len(leaf) != 64:
            raise ValueError(f"the log has no intact leaf at seq {expected + 1}")
        expected = seq
        yield bytes.fromhex(leaf)
    if expected != end:
        raise ValueError(f"the log holds {expected} sequenced events, not {end}")


class StreamedTree:
    """The RFC 6962 tree over the first ``size`` leaves of the log (or of ``leaves``, for tests)."""

    def __init__(self, size: int, *, chunk: int | None = None, leaves: list[bytes] | None = None) -> None:
        chunk = chunk or CHUNK
        if chunk < 1 or chunk & (chunk - 1):
            raise ValueError("the chunk is a power of two")
        self.size, self.chunk = size, chunk
        self._given = leaves
        # One full chunk at a time (rows come in seq order), and the partial last chunk, which
        # every proof of an earlier row reaches for its right-edge sibling.
        self._chunk_at: int | None = None
        self._chunk_tree: merkle.Tree | None = None
        self._tail: merkle.Tree | None = None
        # Level 0: roots of the full chunks; level k: perfect subtrees of chunk * 2**k leaves.
        level: list[bytes] = []
        frontier: list[tuple[int, bytes]] = []
        for leaf in self._read(0, size - size % chunk):
            node, width = leaf, 1
            while frontier and frontier[-1][0] == width:
                node, width = merkle.node_hash(frontier.pop()[1], node), width * 2
            if width == chunk:
                level.append(node)
            else:
                frontier.append((width, node))
        self._upper = [level]
        while len(level) > 1:
            level = [merkle.node_hash(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
            self._upper.append(level)

    def _read(self, start: int, end: int) -> Iterator[bytes]:
        if self._given is not None:
            if end > len(self._given):
                raise ValueError(f"{len(self._given)} leaves, not {end}")
            return iter(self._given[start:end])
        return _leaf_hashes(start, end)

    def _chunk(self, index: int) -> merkle.Tree:
        start = index * self.chunk
        end = min(self.size, start + self.chunk)
        if end - start < self.chunk:
            if self._tail is None:
                self._tail = merkle.Tree(list(self._read(start, end)))
            return self._tail
        if self._chunk_at != index or self._chunk_tree is None:
            self._chunk_tree = merkle.Tree(list(self._read(start, end)))
            self._chunk_at = index
        return self._chunk_tree

    def subtree(self, start: int, end: int) -> bytes:
        """MTH(D[start:end]) for the ranges RFC 6962's recursion visits (``start`` is a multiple
        of the smallest power of two >= ``end - start``, or ``end`` is the tree's size)."""
        n, c = end - start, self.chunk
        if n >= c and n & (n - 1) == 0 and start % n == 0:  # a perfect subtree of whole chunks
            return self._upper[(n // c).bit_length() - 1][start // n]
        if start // c == (end - 1) // c:  # inside one chunk
            base = start - start % c
            return self._chunk(start // c)._subtree(start - base, end - base)
        k = merkle.split(n)
        return merkle.node_hash(self.subtree(start, start + k), self.subtree(start + k, end))

    def root(self) -> bytes:
        return self.subtree(0, self.size) if self.size else merkle.EMPTY_ROOT

    def inclusion_proof(self, index: int) -> list[bytes]:
        if not 0 <= index < self.size:
            raise ValueError(f"leaf {index} is not in a tree of size {self.size}")
        path: list[bytes] = []
        start, end = 0, self.size
        while end - start > 1:
            k = merkle.split(end - start)
            if index < start + k:
                path.append(self.subtree(start + k, end))
                end = start + k
            else:
                path.append(self.subtree(start, start + k))
                start += k
        return path[::-1]

    def consistency_proof(self, first: int) -> list[bytes]:
        if not 0 < first <= self.size:
            raise ValueError(f"no consistency proof from size {first} to {self.size}")
        return self._subproof(first, 0, self.size, True)

    def _subproof(self, m: int, start: int, end: int, complete: bool) -> list[bytes]:
        n = end - start
        if m == n:
            return [] if complete else [self.subtree(start, end)]
        k = merkle.split(n)
        if m <= k:
            return [*self._subproof(m, start, start + k, complete), self.subtree(start + k, end)]
        return [*self._subproof(m - k, start + k, end, False), self.subtree(start, start + k)]


def consistency_proof(first: int, second: int) -> list[bytes]:
    """The proof that the log's tree of ``second`` extends its tree of ``first`` (empty from 0)."""
    if first == 0 or first == second:
        return []
    return StreamedTree(second).consistency_proof(first)
