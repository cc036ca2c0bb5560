"""An evidence pack: one zip a reviewer hands an outside auditor, checkable with a public key.

It holds the selection's events with their inclusion proofs (``events.jsonl``, the JSON Lines
export), the checkpoint it was cut from and the witnessed ones, each a C2SP signed note with its
signatures and cosignatures (``checkpoints/``), the verifier keys (``keys/``), the standard
library verifier itself, and a README with the exact command and the retention statement. It
streams: the zip is written to a sink drained after each batch of rows (data descriptors, no
seeking), so memory stays bounded whatever the selection.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone

from apps.audit import notes
from apps.audit.checkpoints import served_note, witnessed_checkpoints
from apps.audit.export import Cut, jsonl_chunks
from apps.audit.logkeys import log_verifiers, witnesses

VERIFIER = Path(__file__).resolve().parents[2] / "scripts" / "verify_audit_export.py"
PACK_FORMAT = "conductor-audit-evidence/1"


@dataclass(frozen=True)
class Scope:
    """What the pack covers, as the README states it."""

    title: str  # "run 3f…", "team alpha", "all events you may see"
    filters: dict[str, str]
    retention: list[tuple[str, int | None]]  # (team slug, retention_days or None)
    requested_by: str
    export_seq: int  # the audit.exported event recording this download


class _Sink:
    """A write-only file for ZipFile: what it writes is handed out by ``drain``."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass

    def drain(self) -> bytes:
        out = b"".join(self._parts)
        self._parts.clear()
        return out


def verify_command(*, witnessed: bool) -> str:
    witness = " --witness-file keys/witnesses.vkey" if witnessed else ""
    return f"python3 verify_audit_export.py --vkey-file keys/log.vkey{witness} events.jsonl"


def _retention_text(retention: list[tuple[str, int | None]]) -> str:
    lines = []
    for slug, days in retention:
        if days:
            lines.append(
                f"* team `{slug}`: run content (questions, answers, step instructions and outputs, "
                f"stored /v1 conversations) is erased {days} days after the run (`retention_days`)."
            )
        else:
            lines.append(
                f"* team `{slug}`: no `retention_days`; run content is kept until an administrator erases it."
            )
    return "\n".join(lines or ["* no team in this selection"])


def _witness_text(witnessed: bool) -> str:
    if witnessed:
        return (
            "The witnesses in `keys/witnesses.vkey` cosigned this history, or an earlier one it\n"
            "provably extends: the operator could not have rewritten it on their own."
        )
    return (
        "No witness is configured: the log's own signature vouches for the history (see the\n"
        "threat model in docs/audit.md: its key holder could re-sign a rewritten one)."
    )


def readme(
    *, scope: Scope, cut: Cut, witnessed: list[Any], log_keys: list[str], witness_keys: list[str]
) -> str:
    cosigners = sorted({c.witness for w in [cut.sth, *witnessed] for c in w.cosignatures.all()})
    command = verify_command(witnessed=bool(witness_keys))
    return f"""# Audit evidence pack

* Log: `{cut.sth.origin}`
* Selection: {scope.title} (filters: `{json.dumps(scope.filters, sort_keys=True)}`)
* Cut at checkpoint size {cut.sth.tree_size}, root `{notes.b64(bytes.fromhex(cut.sth.root_hash))}`
  (`checkpoints/checkpoint.txt`, a c2sp.org/tlog-checkpoint signed note)
* Cosigned by: {", ".join(cosigners) if cosigners else "no witness yet"}
* Rows: {cut.rows} (seq {cut.first_seq or "-"} to {cut.last_seq or "-"})
* Requested by {scope.requested_by} at {timezone.now().isoformat(timespec="seconds")}; the download
  itself is audit event seq {scope.export_seq}.

## Verify it (Python 3.11 or later, standard library only)

1. Get the log's verifier key from the operator yourself (`manage.py audit_keys`, or
   `/audit/log/keys` on the server) and compare it with `keys/log.vkey`: the key in this pack
   only says which key the pack claims.
2. In the unzipped pack, run exactly:

```
{command}
```

Exit status 0 and `OK: … rows verified` mean: every event is in the log's signed tree (inclusion
proof), its columns are what the log committed to, and no row was removed (the end record is
signed by the log). {_witness_text(bool(witness_keys))}
Anything else prints what failed. `--help` lists the other checks (`--checkpoint`, `--contiguous`,
`--hmac-key-file`).

## Retention

{_retention_text(scope.retention)}

After erasure the audit events stay: they are append-only and never held the text, only its
SHA-256 and length (`run.payload_erased` events record what was erased and when). This pack
therefore verifies before and after erasure; the erased content itself cannot be recovered.

## Files

* `events.jsonl` — the events, each with `canonical` (the committed content), `proof`
  (RFC 6962 inclusion proof, hex), chain `digest`/`prev_digest`; first the cut checkpoint and
  the witnessed ones with consistency proofs, last the signed end record.
* `checkpoints/` — the checkpoints as signed notes, with every signature and cosignature.
* `keys/log.vkey`, `keys/witnesses.vkey` — verifier keys (c2sp.org/signed-note vkeys).
* `verify_audit_export.py` — the verifier. `manifest.json` — the above as data.
"""


def pack_chunks(qs: QuerySet[Any], scope: Scope) -> Iterator[bytes]:
    sink = _Sink()
    cut = Cut()
    with zipfile.ZipFile(sink, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        with archive.open("events.jsonl", "w", force_zip64=True) as events:
            for chunk in jsonl_chunks(qs, cut):
                events.write(chunk)
                yield sink.drain()
        witnessed = [w for w in witnessed_checkpoints(cut.sth.tree_size) if w.pk != cut.sth.pk]
        archive.writestr("checkpoints/checkpoint.txt", served_note(cut.sth))
        for w in witnessed:
            archive.writestr(f"checkpoints/witnessed-{w.tree_size}.txt", served_note(w))
        log_keys = [k.vkey for k in log_verifiers(cut.sth.origin)]
        witness_keys = [w.key.vkey for w in witnesses()]
        archive.writestr("keys/log.vkey", "".join(f"{k}\n" for k in log_keys))
        archive.writestr("keys/witnesses.vkey", "".join(f"{k}\n" for k in witness_keys))
        archive.writestr("verify_audit_export.py", VERIFIER.read_text(encoding="utf-8"))
        archive.writestr(
            "README.md",
            readme(scope=scope, cut=cut, witnessed=witnessed, log_keys=log_keys, witness_keys=witness_keys),
        )
        manifest = {
            "format": PACK_FORMAT,
            "origin": cut.sth.origin,
            "checkpoint_size": cut.sth.tree_size,
            "rows": cut.rows,
            "filters": scope.filters,
            "export_seq": scope.export_seq,
            "retention_days": dict(scope.retention),
            "verify": verify_command(witnessed=bool(witness_keys)),
        }
        archive.writestr("manifest.json", json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    yield sink.drain()
