"""Known answers from published sources, checked against both apps/audit/merkle.py
and scripts/verify_audit_export.py — never against values our code computed (issue 40).

Sources (each value below is transcribed, not computed):

* RFC 6962 tree: transparency-dev/merkle ``testonly/constants.go`` (commit 417fb0c3): the eight
  leaf inputs, every root hash by tree size, the node hashes of the complete subtrees.
* Proof probes: transparency-dev/merkle ``testdata/inclusion`` and ``testdata/consistency`` (same
  commit; the happy paths and the corrupted ones: bit flips, extra/missing/garbage components,
  wrong sizes, empty roots, size 0) in ``tests/audit/vectors/transparency_dev_merkle.json``.
* draft-ietf-plants-merkle-tree-certs, "Subtree Test Vectors" appendix, as reproduced by
  transparency-dev/merkle ``testonly/vectors_test.go``: rolling SHA-256 over every subtree hash
  and subtree inclusion proof of the tree d[i] = byte(i), i < 130.

Signed-note vectors: tests/audit/test_notes.py. The streamed tree against these: test_proofs.py.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from apps.audit import merkle
from tests.audit.offline import script_module

VECTORS = json.loads((Path(__file__).parent / "vectors" / "transparency_dev_merkle.json").read_text())

# testonly/constants.go: LeafInputs(), RootHashes() (index = tree size), NodeHashes() (level, index).
LEAF_INPUTS = [
    "",
    "00",
    "10",
    "2021",
    "3031",
    "40414243",
    "5051525354555657",
    "606162636465666768696a6b6c6d6e6f",
]
ROOTS = [
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]
NODES = [
    [
        "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
        "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
        "0298d122906dcfc10892cb53a73992fc5b9f493ea4c9badb27b791b4127a7fe7",
        "07506a85fd9dd2f120eb694f86011e5bb4662e5c415a62917033d4a9624487e7",
        "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
        "4271a26be0d8a84f0bd54c8c302e7cb3a3b5d1fa6780a40bcce2873477dab658",
        "b08693ec2e721597130641e8211e7eedccb4c26413963eee6c1e2ed16ffb1a5f",
        "46f6ffadd3d06a09ff3c5860d2755c8b9819db7df44251788c7d8e3180de8eb1",
    ],
    [
        "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
        "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
        "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
        "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
    ],
    [
        "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
    ],
    ["5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328"],
]
# draft-ietf-plants-merkle-tree-certs "Subtree Test Vectors" (testonly/vectors_test.go).
SUBTREE_HASH_VECTOR = "b82806ad4265bb151c1119c0f4db437bb4d1a1f887b3a7fba1cd4ebf552e3e81"
SUBTREE_INCLUSION_VECTOR = "ac2a8f989e44d99e399db448050ff5f19757df53cfb716aa81015d3955d8163f"


def _b(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


@pytest.fixture(scope="module")
def script() -> ModuleType:
    return script_module()


def _leaves(hasher: Any) -> list[bytes]:
    return [hasher(bytes.fromhex(x)) for x in LEAF_INPUTS]


def test_rfc6962_roots_and_nodes_of_the_eight_standard_leaves(script: ModuleType) -> None:
    leaves = _leaves(merkle.leaf_hash)
    assert [leaf.hex() for leaf in leaves] == NODES[0]
    assert [leaf.hex() for leaf in _leaves(script.leaf_hash)] == NODES[0]
    frontier: merkle.Frontier = []
    assert merkle.frontier_root(frontier).hex() == ROOTS[0]
    for size in range(1, 9):
        frontier = merkle.frontier_append(frontier, leaves[size - 1])
        assert merkle.Tree(leaves[:size]).root().hex() == ROOTS[size]  # the in-memory tree
        assert merkle.frontier_root(frontier).hex() == ROOTS[size]  # the sequencer's right edge
    tree = merkle.Tree(leaves)
    for level, hashes in enumerate(NODES):
        width = 1 << level
        assert [tree._subtree(i * width, (i + 1) * width).hex() for i in range(len(hashes))] == hashes
    assert _parents(script.node_hash) == NODES[1:]


def _parents(node_hash: Any) -> list[list[str]]:
    """Each level of NODES above the leaves, rebuilt from the level below with ``node_hash``."""
    return [
        [
            node_hash(bytes.fromhex(below[i]), bytes.fromhex(below[i + 1])).hex()
            for i in range(0, len(below), 2)
        ]
        for below in NODES[:-1]
    ]


def _probe_results(verify_inclusion: Any, verify_consistency: Any) -> list[str]:
    wrong = []
    for p in VECTORS["inclusion"]:
        got = verify_inclusion(
            _b(p["leafHash"]), p["leafIdx"], p["treeSize"], [_b(x) for x in p["proof"] or []], _b(p["root"])
        )
        if got == p["wantErr"]:
            wrong.append(f"{p['file']}: {'accepted' if got else 'refused'}")
    for p in VECTORS["consistency"]:
        got = verify_consistency(
            p["size1"], p["size2"], _b(p["root1"]), _b(p["root2"]), [_b(x) for x in p["proof"] or []]
        )
        if got == p["wantErr"]:
            wrong.append(f"{p['file']}: {'accepted' if got else 'refused'}")
    return wrong


def test_transparency_dev_probes_pass_in_the_module_and_the_offline_verifier(script: ModuleType) -> None:
    assert len(VECTORS["inclusion"]) == 98 and len(VECTORS["consistency"]) == 98
    assert (
        sum(p["wantErr"] for p in VECTORS["inclusion"] + VECTORS["consistency"]) > 150
    )  # mostly corruptions
    assert _probe_results(merkle.verify_inclusion, merkle.verify_consistency) == []
    assert _probe_results(script.verify_inclusion, script.verify_consistency) == []


def test_our_proofs_are_the_published_ones() -> None:
    """The happy-path probes over the eight standard leaves: the proofs our trees generate are
    byte for byte the published proofs."""
    leaves = _leaves(merkle.leaf_hash)
    checked = 0
    for p in VECTORS["inclusion"]:
        if p["desc"] == "happy path" and p["treeSize"] <= 8 and _b(p["leafHash"]) == leaves[p["leafIdx"]]:
            tree = merkle.Tree(leaves[: p["treeSize"]])
            assert tree.inclusion_proof(p["leafIdx"]) == [_b(x) for x in p["proof"] or []], p["file"]
            checked += 1
    for p in VECTORS["consistency"]:
        if p["desc"] == "happy path" and p["size1"] > 0 and p["size2"] <= 8:
            tree = merkle.Tree(leaves[: p["size2"]])
            assert tree.root() == _b(p["root2"])
            assert tree.consistency_proof(p["size1"]) == [_b(x) for x in p["proof"] or []], p["file"]
            checked += 1
    assert checked >= 8


def _valid_subtree(start: int, end: int) -> bool:
    if start == 0 or start == end:
        return True
    return start & ((1 << (end - start - 1).bit_length()) - 1) == 0


def test_draft_subtree_vectors_up_to_130_leaves() -> None:
    leaves = [merkle.leaf_hash(bytes([i])) for i in range(130)]
    hashes, proofs = hashlib.sha256(), hashlib.sha256()
    for end in range(131):
        for start in range(end + 1):
            if not _valid_subtree(start, end):
                continue
            tree = merkle.Tree(leaves[start:end]) if start < end else None
            root = tree.root() if tree else merkle.EMPTY_ROOT
            hashes.update(f"[{start}, {end}) {root.hex()}\n".encode())
            for index in range(start, end):
                assert tree is not None
                path = "".join(f" {h.hex()}" for h in tree.inclusion_proof(index - start))
                proofs.update(f"{index} [{start}, {end}){path}\n".encode())
    assert hashes.hexdigest() == SUBTREE_HASH_VECTOR
    assert proofs.hexdigest() == SUBTREE_INCLUSION_VECTOR


def test_a_mutated_domain_separation_prefix_fails_the_vectors(
    monkeypatch: pytest.MonkeyPatch, script: ModuleType
) -> None:
    """The old self-referential test passed with the prefixes changed; these do not."""
    for module in (merkle, script):
        with monkeypatch.context() as patch:
            patch.setattr(module, "LEAF_PREFIX", b"\x02")
            assert [leaf.hex() for leaf in _leaves(module.leaf_hash)] != NODES[0]
            if module is merkle:
                assert merkle.Tree(_leaves(merkle.leaf_hash)).root().hex() != ROOTS[8]
        with monkeypatch.context() as patch:
            patch.setattr(module, "NODE_PREFIX", b"\x02")
            assert _parents(module.node_hash) != NODES[1:]
            wrong = _probe_results(module.verify_inclusion, module.verify_consistency)
            assert len([w for w in wrong if "happy-path.json: refused" in w]) >= 8  # every happy path
            if module is merkle:
                assert merkle.Tree(_leaves(merkle.leaf_hash)).root().hex() != ROOTS[8]
    # Unpatched again: everything passes (the patch, not the test, made them fail).
    assert _probe_results(script.verify_inclusion, script.verify_consistency) == []


def test_the_edge_cases_of_issue_40_are_refused_as_transparency_dev_does(script: ModuleType) -> None:
    empty = merkle.EMPTY_ROOT
    for verify_inclusion, verify_consistency in (
        (merkle.verify_inclusion, merkle.verify_consistency),
        (script.verify_inclusion, script.verify_consistency),
    ):
        assert not verify_inclusion(b"", 0, 1, [], b"")  # size 1, empty leaf and root
        assert not verify_inclusion(b"x" * 31, 0, 1, [], b"x" * 31)
        assert verify_inclusion(b"x" * 32, 0, 1, [], b"x" * 32)
        assert not verify_consistency(0, 1, empty, empty, [empty])  # a proof from size 0 means nothing
        assert not verify_consistency(0, 1, empty, b"y" * 32, [])
    # ... but a checkpoint of size 0 is consistent with any later one (c2sp.org/tlog-witness).
    for consistent in (merkle.checkpoints_consistent, script.checkpoints_consistent):
        assert consistent(0, 5, empty, b"y" * 32, [])
        assert not consistent(0, 5, b"z" * 32, b"y" * 32, [])  # a size-0 head has the empty root
        assert not consistent(0, 5, empty, b"y" * 32, [empty])
