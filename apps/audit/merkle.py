"""RFC 9162 (Certificate Transparency v2) Merkle tree arithmetic, standard library only.

leaf = SHA-256(0x00 || entry), node = SHA-256(0x01 || left || right); the tree over n leaves
splits at the largest power of two below n. ``scripts/verify_audit_export.py`` carries its own
verification half (it must run without this project); tests/audit/test_vectors.py checks both
against the published RFC 6962 / transparency-dev answers.

Tree heads are Ed25519-signed C2SP checkpoints (``apps.audit.notes``, ``apps.audit.checkpoints``).
``sth_message`` / ``sth_valid`` remain for the HMAC-signed heads stored before checkpoints.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

STH_FORMAT = "conductor-audit-sth/1"
EMPTY_ROOT = hashlib.sha256(b"").digest()
HASH_SIZE = 32
# RFC 6962 domain separation: a leaf can never pass for an interior node. Module globals on
# purpose: the known-answer tests mutate them to show the published vectors then fail.
LEAF_PREFIX = b"\x00"
NODE_PREFIX = b"\x01"


def leaf_hash(entry: bytes) -> bytes:
    return hashlib.sha256(LEAF_PREFIX + entry).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(NODE_PREFIX + left + right).digest()


def split(n: int) -> int:
    """The largest power of two strictly below n (n >= 2)."""
    return 1 << ((n - 1).bit_length() - 1)


# --- the right edge: append-only root maintenance ------------------------------------------------

Frontier = list[list[object]]  # [[size, hex], ...], JSON-friendly


def frontier_append(frontier: Frontier, leaf: bytes) -> Frontier:
    """Add one leaf; perfect subtrees of equal size merge (binary counter)."""
    out = [list(item) for item in frontier]
    size, node = 1, leaf
    while out and out[-1][0] == size:
        left = out.pop()
        node = node_hash(bytes.fromhex(str(left[1])), node)
        size *= 2
    out.append([size, node.hex()])
    return out


def frontier_root(frontier: Frontier) -> bytes:
    if not frontier:
        return EMPTY_ROOT
    root = bytes.fromhex(str(frontier[-1][1]))
    for _, left in reversed(frontier[:-1]):
        root = node_hash(bytes.fromhex(str(left)), root)
    return root


# --- a whole tree in memory: roots at any size, inclusion and consistency proofs -----------------


class Tree:
    """Levels built bottom-up (a lone last node is carried up), which equals RFC 9162's MTH."""

    def __init__(self, leaves: Sequence[bytes]) -> None:
        self.size = len(leaves)
        self.levels: list[list[bytes]] = [list(leaves)]
        level = self.levels[0]
        while len(level) > 1:
            nxt = [node_hash(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
            if len(level) % 2:
                nxt.append(level[-1])
            self.levels.append(nxt)
            level = nxt

    def _subtree(self, start: int, end: int) -> bytes:
        """MTH(D[start:end]) for start < end <= size."""
        n = end - start
        if n == 1:
            return self.levels[0][start]
        height = (n - 1).bit_length()
        if start % (1 << height) == 0 and (n == 1 << height or end == self.size):
            return self.levels[height][start >> height]
        k = split(n)
        return node_hash(self._subtree(start, start + k), self._subtree(start + k, end))

    def root(self, size: int | None = None) -> bytes:
        size = self.size if size is None else size
        if size == 0:
            return EMPTY_ROOT
        if size > self.size:
            raise ValueError(f"tree has {self.size} leaves, not {size}")
        return self._subtree(0, size)

    def inclusion_proof(self, index: int, size: int | None = None) -> list[bytes]:
        size = self.size if size is None else size
        if not 0 <= index < size <= self.size:
            raise ValueError(f"leaf {index} is not in a tree of size {size}")
        path: list[bytes] = []
        start, end = 0, size
        while end - start > 1:
            k = split(end - start)
            if index < start + k:
                path.append(self._subtree(start + k, end))
                end = start + k
            else:
                path.append(self._subtree(start, start + k))
                start += k
        return list(reversed(path))  # RFC order: leaf-side first

    def consistency_proof(self, first: int, second: int | None = None) -> list[bytes]:
        second = self.size if second is None else second
        if not 0 < first <= second <= self.size:
            raise ValueError(f"no consistency proof from size {first} to {second}")
        return self._subproof(first, 0, second, True)

    def _subproof(self, m: int, start: int, end: int, complete: bool) -> list[bytes]:
        n = end - start
        if m == n:
            return [] if complete else [self._subtree(start, end)]
        k = split(n)
        if m <= k:
            return [*self._subproof(m, start, start + k, complete), self._subtree(start + k, end)]
        return [*self._subproof(m - k, start + k, end, False), self._subtree(start, start + k)]


def root_of(leaves: Sequence[bytes]) -> bytes:
    return Tree(leaves).root() if leaves else EMPTY_ROOT


# --- verification, as transparency-dev/merkle's proof package does it --------------------------
#
# Proofs are checked for their exact length and every hash for 32 bytes: a size-1 inclusion proof
# with an empty leaf and an empty root, or a consistency proof from size 0, is refused.


def _hashes_ok(*hashes: bytes) -> bool:
    return all(isinstance(h, bytes) and len(h) == HASH_SIZE for h in hashes)


def _decompose(index: int, size: int) -> tuple[int, int]:
    """Inner and border lengths of leaf ``index``'s inclusion proof in a tree of ``size``: inner
    nodes lie below the level where the paths to ``index`` and ``size - 1`` part, border nodes
    (left siblings only) above it."""
    inner = (index ^ (size - 1)).bit_length()
    return inner, (index >> inner).bit_count()


def _chain_inner(seed: bytes, proof: Sequence[bytes], index: int) -> bytes:
    for i, h in enumerate(proof):
        seed = node_hash(h, seed) if (index >> i) & 1 else node_hash(seed, h)
    return seed


def _chain_inner_right(seed: bytes, proof: Sequence[bytes], index: int) -> bytes:
    # Only the left siblings: the hash of the earlier version of this subtree.
    for i, h in enumerate(proof):
        if (index >> i) & 1:
            seed = node_hash(h, seed)
    return seed


def _chain_border_right(seed: bytes, proof: Sequence[bytes]) -> bytes:
    for h in proof:
        seed = node_hash(h, seed)
    return seed


def root_from_inclusion(leaf: bytes, index: int, size: int, proof: Sequence[bytes]) -> bytes | None:
    if not 0 <= index < size or not _hashes_ok(leaf, *proof):
        return None
    inner, border = _decompose(index, size)
    if len(proof) != inner + border:
        return None
    return _chain_border_right(_chain_inner(leaf, proof[:inner], index), proof[inner:])


def verify_inclusion(leaf: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes) -> bool:
    computed = root_from_inclusion(leaf, index, size, proof)
    return computed is not None and _hashes_ok(root) and hmac.compare_digest(computed, root)


def verify_consistency(
    first: int, second: int, first_root: bytes, second_root: bytes, proof: Sequence[bytes]
) -> bool:
    """RFC 9162 consistency, 0 < first <= second (a proof from the empty tree means nothing:
    ``checkpoints_consistent`` decides size 0)."""
    if not 0 < first <= second:
        return False
    if first == second:  # as transparency-dev: equal roots, whatever their length, and no proof
        return not proof and hmac.compare_digest(first_root, second_root)
    if not proof or not _hashes_ok(first_root, second_root, *proof):
        return False
    fork, border = _decompose(first - 1, second)
    shift = (first & -first).bit_length() - 1  # trailing zeros: the first tree's rightmost perfect subtree
    inner = fork - shift
    seed, skip = proof[0], 1
    if first == 1 << shift:  # the first tree is perfect: its root is the seed, not in the proof
        seed, skip = first_root, 0
    if len(proof) != skip + inner + border:
        return False
    path, mask = proof[skip:], (first - 1) >> shift
    old = _chain_border_right(_chain_inner_right(seed, path[:inner], mask), path[inner:])
    new = _chain_border_right(_chain_inner(seed, path[:inner], mask), path[inner:])
    return hmac.compare_digest(old, first_root) and hmac.compare_digest(new, second_root)


def checkpoints_consistent(
    first: int, second: int, first_root: bytes, second_root: bytes, proof: Sequence[bytes]
) -> bool:
    """Is the tree (second, second_root) an append-only extension of (first, first_root)? The
    empty tree is consistent with every tree, with an empty proof (c2sp.org/tlog-witness)."""
    if first == 0:
        return (
            not proof
            and second >= 0
            and hmac.compare_digest(first_root, EMPTY_ROOT)
            and _hashes_ok(second_root)
        )
    return verify_consistency(first, second, first_root, second_root, proof)


# --- HMAC tree heads (before checkpoints: still verified where they are stored) -------------------


def sth_message(tree_size: int, root_hash_hex: str, timestamp_ms: int) -> bytes:
    return f"{STH_FORMAT}\n{tree_size}\n{root_hash_hex}\n{timestamp_ms}".encode()


def sth_sign(key: bytes, tree_size: int, root_hash_hex: str, timestamp_ms: int) -> str:
    return hmac.new(key, sth_message(tree_size, root_hash_hex, timestamp_ms), hashlib.sha256).hexdigest()


def sth_valid(key: bytes, sth: dict[str, object]) -> bool:
    try:
        expected = sth_sign(key, int(sth["tree_size"]), str(sth["root_hash"]), int(sth["timestamp"]))  # type: ignore[call-overload]
    except (KeyError, TypeError, ValueError):
        return False
    return hmac.compare_digest(expected, str(sth.get("signature", "")))
