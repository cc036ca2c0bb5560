"""Signed notes, checkpoints and cosignatures (c2sp.org) against published vectors, in
apps/audit/notes.py and in the offline verifier's own (standard library) implementation.

Sources (transcribed): c2sp.org/signed-note's example; Go's ``golang.org/x/mod/sumdb/note``
``note_test.go`` (PeterNeumann/EnochRoot keys and signatures); a real sum.golang.org checkpoint
and its key from transparency-dev/formats ``log/note_test.go``.
"""

from __future__ import annotations

import secrets
from types import ModuleType

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from apps.audit import notes
from tests.audit.offline import script_module

# c2sp.org/signed-note "Example".
C2SP_VKEY = "example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k"
C2SP_NOTE = (
    "This is an example message.\n\n— example.com/foo "
    "Uw2QOkn8srV1yJGh2VYRlL1Tnagv1YEq6TfXppzi2ONncAlTgK7Ztg1ERYNZXsYjOBH3mFXmRKuwHjG1Yu72IneyaQM=\n"
)
# golang.org/x/mod/sumdb/note note_test.go: TestNewSigner/TestSign/TestOpen.
GO_SKEY = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
GO_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
ENOCH_VKEY = "EnochRoot+af0cfe78+ATtqJ7zOtqQtYqOo0CpvDXNlMhV3HeJDpjrASKGLWdop"
GO_TEXT = (
    "If you think cryptography is the answer to your problem,\nthen you don't know what your problem is.\n"
)
GO_SIG = "— PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n"
ENOCH_SIG = "— EnochRoot rwz+eBzmZa0SO3NbfRGzPCpDckykFXSdeX+MNtCOXm2/5n2tiOHp+vAF1aGrQ5ovTG01oOTGwnWLox33WWd1RvMc+QQ=\n"
# transparency-dev/formats log/note_test.go TestSumDBNoteParsing: a real Go checksum database head.
SUMDB_VKEY = "sum.golang.org+033de0ae+Ac4zctda0e5eza+HJyk9SxEdh+s3Ux18htTTAD8OuAn8"
SUMDB_NOTE = (
    "go.sum database tree\n6476701\nmb8QLQIs0Z0yP5Cstq6guj87oXWeC9gEM8oVikmm9Wk=\n\n— sum.golang.org "
    "Az3grsLX85Gz+s1SiTbgkuqxgItqFq7gsMUEyVnrsa9LM7Us9S+1xbFIGu95949rj4nPRYfvimWEPWL+o3GeoWwOoAw=\n"
)


@pytest.fixture(scope="module")
def script() -> ModuleType:
    return script_module()


def test_signed_note_vectors(script: ModuleType) -> None:
    signer = notes.parse_private_key(GO_SKEY)
    assert signer.verifier.vkey == GO_VKEY  # name, key id and key as Go derives them
    assert signer.signature_line(GO_TEXT) == GO_SIG  # Ed25519 is deterministic: Go's exact signature
    both = GO_TEXT + "\n" + GO_SIG + ENOCH_SIG
    keys = [notes.parse_vkey(GO_VKEY), notes.parse_vkey(ENOCH_VKEY)]
    assert [k.name for k, _ in notes.open_note(both, keys).verified] == ["PeterNeumann", "EnochRoot"]
    assert (
        notes.open_note(C2SP_NOTE, [notes.parse_vkey(C2SP_VKEY)]).note.text == "This is an example message.\n"
    )
    sumdb = notes.open_note(SUMDB_NOTE, [notes.parse_vkey(SUMDB_VKEY)])
    assert notes.parse_checkpoint(sumdb.note.text).size == 6476701
    script_keys = [script.Key(GO_VKEY), script.Key(ENOCH_VKEY)]
    assert [k.name for k, _ in script.open_note(both, script_keys)[1]] == ["PeterNeumann", "EnochRoot"]
    assert script.open_note(C2SP_NOTE, [script.Key(C2SP_VKEY)])[0] == "This is an example message.\n"
    assert script.parse_checkpoint(script.open_note(SUMDB_NOTE, [script.Key(SUMDB_VKEY)])[0])[1] == 6476701
    # One flipped byte of the signature, or of the text, and it no longer opens.
    bad_sig = SUMDB_NOTE.replace("Az3grsLX85", "Az3grsLX86")
    bad_text = SUMDB_NOTE.replace("6476701", "6476702")
    for data in (bad_sig, bad_text):
        with pytest.raises(notes.NoteError):
            notes.open_note(data, [notes.parse_vkey(SUMDB_VKEY)])
        with pytest.raises(script.Bad):
            script.open_note(data, [script.Key(SUMDB_VKEY)])
    # A mangled vkey is refused (Go's TestNewVerifier: wrong id, unknown algorithm).
    for mangled in (
        GO_VKEY.replace("c74f20a3", "c74f20a4"),
        "PeterNeumann+173116ae+ZRpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",
    ):
        with pytest.raises(notes.NoteError):
            notes.parse_vkey(mangled)
        with pytest.raises(script.Bad):
            script.Key(mangled)


def test_cosignatures_round_trip_and_bind_their_time(script: ModuleType) -> None:
    witness = notes.Signer("witness.example/w1", secrets.token_bytes(32), notes.COSIGNATURE_V1)
    text = notes.Checkpoint("example.com/log", 3, b"\x07" * 32).text
    line = witness.signature_line(text, timestamp=1_700_000_000)
    opened = notes.open_note(text + "\n" + line, [witness.verifier])
    assert opened.verified == ((witness.verifier, 1_700_000_000),)
    assert script.open_note(text + "\n" + line, [script.Key(witness.verifier.vkey)])[1][0][1] == 1_700_000_000
    # Key id domain separation: the cosigner key (type 4) is not the same key as a note key (type 1).
    as_note_key = notes.Verifier(witness.name, notes.ED25519, witness.public)
    assert as_note_key.key_id != witness.verifier.key_id
    with pytest.raises(notes.NoteError, match="no signature from a known key"):
        notes.open_note(text + "\n" + line, [as_note_key])
    # The time is signed: changing it breaks the cosignature.
    sig = notes.parse_signature_line(line)
    other_time = (1_700_000_001).to_bytes(8) + sig.raw[8:]
    forged = f"— {witness.name} {notes.b64(sig.key_id.to_bytes(4) + other_time)}\n"
    with pytest.raises(notes.NoteError, match="does not verify"):
        notes.open_note(text + "\n" + forged, [witness.verifier])
    with pytest.raises(script.Bad):
        script.open_note(text + "\n" + forged, [script.Key(witness.verifier.vkey)])


def test_the_standard_library_ed25519_agrees_with_cryptography(script: ModuleType) -> None:
    for size in (0, 1, 31, 64, 300):
        key = Ed25519PrivateKey.generate()
        public = notes.Signer("k", key.private_bytes_raw()).public
        message = secrets.token_bytes(size)
        signature = key.sign(message)
        assert script.ed25519_verify(public, message, signature)
        for i in (0, 31, 32, 63):  # R and S halves
            bad = bytearray(signature)
            bad[i] ^= 0x01
            assert not script.ed25519_verify(public, message, bytes(bad))
        assert not script.ed25519_verify(public, message + b"!", signature)
        # S must be reduced (no malleability): S + L is refused.
        s_value = int.from_bytes(signature[32:], "little") + script._L
        if s_value < 1 << 256:
            assert not script.ed25519_verify(public, message, signature[:32] + s_value.to_bytes(32, "little"))


def test_malformed_notes_and_checkpoints_are_refused() -> None:
    key = notes.Signer("example.com/log", secrets.token_bytes(32))
    body = notes.Checkpoint("example.com/log", 2, b"\x01" * 32).text
    good = body + "\n" + key.signature_line(body)
    assert notes.open_note(good, [key.verifier]).note.text == body
    for bad in (
        body + key.signature_line(body),  # no blank line
        good.rstrip("\n"),  # no final newline
        good.replace("example.com/log\n2", "example.com/log\x07\n2"),  # a control character
        body + "\n" + "— example.com/log AAAA\n",  # a signature too short for its key id
    ):
        with pytest.raises(notes.NoteError):
            notes.open_note(bad, [key.verifier])
    for text in (
        "o\n01\n" + notes.b64(b"\x01" * 32) + "\n",
        "o\n1\n" + notes.b64(b"\x01" * 31) + "\n",
        "o\n1\n",
    ):
        with pytest.raises(notes.NoteError):
            notes.parse_checkpoint(text)
    with pytest.raises(notes.NoteError, match="empty tree"):
        notes.parse_checkpoint("o\n0\n" + notes.b64(b"\x01" * 32) + "\n")
