"""Witnessing (issue 40): scripts/audit_witness.py, a separate process on a real socket with its
own key and state file, cosigns the log's checkpoints over the c2sp.org/tlog-witness protocol,
checks consistency first and refuses a fork; the offline verifier, with public keys only,
reports which witnesses cosigned and catches a history its operator rewrote and re-signed."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.http import StreamingHttpResponse

from apps.audit import notes
from apps.audit.checkpoints import checkpoint_publish, log_origin, served_note
from apps.audit.logkeys import log_signer
from apps.audit.models import Cosignature
from apps.audit.proofs import StreamedTree
from apps.audit.witnessing import request_body
from tests.audit.offline import verify_offline
from tests.factories.audit import append_events
from tests.fixtures.audit import NAME, WITNESS, WitnessProcess


def _export(client: Any, tmp_path: Path) -> Path:
    response = client.get("/audit/export.jsonl")
    assert response.status_code == 200 and isinstance(response, StreamingHttpResponse)
    path = tmp_path / "export.jsonl"
    path.write_bytes(b"".join(response.streaming_content))
    return path


@pytest.mark.runtime
@pytest.mark.django_db
def test_the_witness_cosigns_each_extension_and_the_verifier_names_it(
    witness: WitnessProcess, client: Any, superuser: Any, tmp_path: Path
) -> None:
    origin = log_origin()
    append_events(5)
    first = checkpoint_publish()
    (cosignature,) = Cosignature.objects.filter(checkpoint=first)
    assert (cosignature.witness, witness.held(origin)["size"]) == (NAME, first.tree_size)
    opened = notes.open_note(served_note(first), [notes.parse_vkey(witness.vkey)])
    assert opened.verified[0][1] == cosignature.timestamp  # a signed time
    append_events(3)
    second = checkpoint_publish()  # sent with the consistency proof from the witness's size
    assert witness.held(origin)["size"] == second.tree_size > first.tree_size
    assert Cosignature.objects.filter(checkpoint=second, witness=NAME).exists()
    # The keys page lists the witness; the checkpoint endpoint serves the cosigned note.
    client.force_login(superuser)
    assert witness.vkey in client.get("/audit/log/keys").content.decode()
    assert client.get("/audit/log/checkpoint").content.decode().count(f"— {NAME} ") == 1

    path = _export(client, tmp_path)  # cut after the export's own record: size + 1, not cosigned
    result = verify_offline(path, "--witness", witness.vkey)
    assert result.returncode == 0, result.stderr
    assert (
        f"cosigned by: {NAME} size {second.tree_size} (time {Cosignature.objects.get(checkpoint=second).timestamp}), extended to"
        in result.stdout
    )


@pytest.mark.runtime
@pytest.mark.django_db
def test_a_history_rewritten_and_re_signed_by_the_operator_is_caught_by_the_witness(
    witness: WitnessProcess, client: Any, superuser: Any, tmp_path: Path, tamper: Any
) -> None:
    """Done means: a rewritten history with a valid operator signature, a witness holding the
    old head: detected by the offline verifier with only the public keys."""
    origin = log_origin()
    events = append_events(6)
    witnessed = checkpoint_publish()
    held = witness.held(origin)
    tamper.rewrite_from(
        events[1].seq, json.dumps({"i": 1, "note": "quietly changed"}), resign_witnessed=False
    )
    append_events(2)
    latest = checkpoint_publish()
    # The rewritten log's checkpoints carry valid signatures of the log's own key, but the witness
    # refuses to cosign the fork and keeps the head it saw.
    assert notes.open_note(latest.note, [log_signer(origin).verifier])
    assert not Cosignature.objects.filter(checkpoint=latest).exists()
    assert witness.held(origin) == held
    client.force_login(superuser)
    path = _export(client, tmp_path)

    # The old cosignature still rides along: the consistency proof from the witnessed head fails.
    result = verify_offline(path, "--witness", witness.vkey)
    assert result.returncode == 1
    assert f"is not consistent with the one cosigned at size {witnessed.tree_size} ({NAME})" in result.stderr
    assert "history was rewritten after it was witnessed" in result.stderr
    # The operator re-signs the witnessed checkpoint over the rewritten tree: the witness's
    # cosignature is over another head.
    records = [json.loads(line) for line in path.read_text().splitlines()]
    (item,) = records[0]["witnessed"]
    body = notes.Checkpoint(origin, witnessed.tree_size, StreamedTree(witnessed.tree_size).root()).text
    cosignature_line = Cosignature.objects.get(checkpoint=witnessed).line
    item["checkpoint"] = body + "\n" + log_signer(origin).signature_line(body) + cosignature_line
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    result = verify_offline(path, "--witness", witness.vkey)
    assert result.returncode == 1
    assert (
        f"the witnessed checkpoint of size {witnessed.tree_size}: the signature of {NAME}+" in result.stderr
    )
    # The operator drops the witnessed checkpoints from the export: the witness's cosignature is missing.
    records[0]["witnessed"] = []
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    result = verify_offline(path, "--witness", witness.vkey)
    assert result.returncode == 1
    assert f"witness {NAME} cosigned neither this checkpoint nor one it extends" in result.stderr
    assert "REFUSED fork" in witness.stop()


@pytest.mark.runtime
@pytest.mark.django_db
def test_the_witness_speaks_the_protocol_and_refuses_a_fork(witness: WitnessProcess) -> None:
    origin = log_origin()
    signer = log_signer(origin)
    append_events(4)
    sth = checkpoint_publish()
    size = sth.tree_size

    def signed(size: int, root: bytes, key: notes.Signer = signer) -> str:
        body = notes.Checkpoint(origin, size, root).text
        return body + "\n" + key.signature_line(body)

    # A stale old size: 409 with the size the witness holds.
    assert witness.post(request_body(0, [], sth.note)) == (409, "text/x.tlog.size", f"{size}\n")
    # Another size-`size` tree (a fork at equal size): 422, nothing cosigned, state kept.
    status, _, text = witness.post(request_body(size, [], signed(size, b"\x13" * 32)))
    assert (status, witness.held(origin)["size"]) == (422, size) and "not consistent" in text
    # A longer tree whose proof does not lead from the held root: 422.
    leaves = [b"\x01" * 32] * (size + 3)
    forked = StreamedTree(size + 3, leaves=leaves)
    body = request_body(size, forked.consistency_proof(size), signed(size + 3, forked.root()))
    assert witness.post(body)[0] == 422
    assert witness.held(origin)["root"] == base64.b64encode(bytes.fromhex(sth.root_hash)).decode()
    # Not the log's key: 403. Unknown origin: 404. Old size beyond the checkpoint: 400. Garbage: 400.
    impostor = notes.Signer(origin, b"\x07" * 32)
    assert (
        witness.post(request_body(size, [], signed(size, bytes.fromhex(sth.root_hash), impostor)))[0] == 403
    )
    other = notes.Checkpoint("example.com/other", 1, b"\x01" * 32).text
    assert (
        witness.post(
            request_body(
                0, [], other + "\n" + notes.Signer("example.com/other", b"\x01" * 32).signature_line(other)
            )
        )[0]
        == 404
    )
    assert witness.post(request_body(size + 9, [], sth.note))[0] == 400
    assert witness.post(b"hello")[0] == 400
    # The same head again: cosigned (idempotent), state unchanged.
    status, _, line = witness.post(request_body(size, [], sth.note))
    assert status == 200 and line.startswith(f"— {NAME} ")


def test_the_witness_refuses_a_key_name_the_note_format_forbids(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(WITNESS), "keygen", "--name", "has space", "--key", str(tmp_path / "k")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode != 0 and "without spaces or '+'" in result.stderr
    assert not (tmp_path / "k").exists()
