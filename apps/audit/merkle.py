"""RFC 9162 (Certificate Transparency v2) Merkle tree arithmetic, standard library only.

leaf = SHA-256(0x00 || entry), node = SHA-256(0x01 || left || right); the tree over n leaves
splits at the largest power of two below n. ``scripts/verify_audit_export.py`` carries a copy of
the verification half (it must run without this project); keep the two in step.

Signed tree heads are HMAC-SHA256 (``AUDIT_HMAC_KEY``) over ``sth_message``: the deployment has
one secret already and the verifier holds it; a public-key signature would be a drop-in change.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

STH_FORMAT = "conductor-audit-sth/1"
EMPTY_ROOT = hashlib.sha256(b"").digest()


def leaf_hash(entry: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + entry).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
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
        k = _split(n)
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
            k = _split(end - start)
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
        k = _split(n)
        if m <= k:
            return [*self._subproof(m, start, start + k, complete), self._subtree(start + k, end)]
        return [*self._subproof(m - k, start + k, end, False), self._subtree(start, start + k)]


def root_of(leaves: Sequence[bytes]) -> bytes:
    return Tree(leaves).root() if leaves else EMPTY_ROOT


# --- verification (RFC 9162 2.1.3.2 and 2.1.4.2) -------------------------------------------------


def verify_inclusion(leaf: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes) -> bool:
    if not 0 <= index < size:
        return False
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while not (fn & 1 or fn == 0):
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    return sn == 0 and hmac.compare_digest(r, root)


def verify_consistency(
    first: int, second: int, first_root: bytes, second_root: bytes, proof: Sequence[bytes]
) -> bool:
    if first == second:
        return not proof and hmac.compare_digest(first_root, second_root)
    if not 0 < first < second or not proof:
        return False
    path = list(proof)
    if first & (first - 1) == 0:  # a power of two: the old root is itself a node of the path
        path.insert(0, first_root)
    fn, sn = first - 1, second - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if not fn & 1:
                while not (fn & 1 or fn == 0):
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    return sn == 0 and hmac.compare_digest(fr, first_root) and hmac.compare_digest(sr, second_root)


# --- signed tree heads ---------------------------------------------------------------------------


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
