"""The tree heads verify compares the log with, each named by its source.

Three kinds: the checkpoints stored in the database, a checkpoint an auditor kept
(``audit_verify --checkpoint``) and the last one published outside the database
(``AUDIT_STH_PUBLISH_PATH``). Only heads of this log's origin are checked: a published head of
another log (another database on the same checkout, a demo reset) is reported as such, never as
tampering. A head signed by no trusted key is a forgery; one whose root differs from the log's
tree at its size means history was rewritten; one larger than the log means its tail was cut.
Heads from before checkpoints (no origin, HMAC-signed) are checked in the database, where they
can only be this log's, and reported as not checked in a published file, where they cannot be
told apart from another database's.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apps.audit import merkle, notes
from apps.audit.models import SignedTreeHead


@dataclass(frozen=True)
class Head:
    source: str  # what the verdict names: where this head came from
    origin: str  # "" for a head from before checkpoints (HMAC)
    size: int
    root_hex: str
    note: str = ""
    legacy: dict[str, Any] | None = None  # the HMAC head, for those

    def problem(self, *, origin: str, verifiers: list[notes.Verifier], hmac_key: bytes) -> str:
        """Why this head cannot be trusted ("" when its signature and fields hold)."""
        if self.legacy is not None:
            return (
                ""
                if merkle.sth_valid(hmac_key, self.legacy)
                else "has a bad HMAC signature (forged or wrong key)"
            )
        try:
            opened = notes.open_note(self.note, verifiers)
            checkpoint = notes.parse_checkpoint(opened.note.text)
        except notes.NoteError as exc:
            return f"has no valid signature of this log's keys (forged, or signed by another key): {exc}"
        if checkpoint.origin != origin:
            return f"is signed for origin {checkpoint.origin}, not {origin}"
        if (checkpoint.size, checkpoint.root.hex()) != (self.size, self.root_hex):
            return f"states size {self.size} but its signed text says {checkpoint.size}"
        return ""


def from_note(note: str, source: str) -> Head:
    """A head from a signed checkpoint's text (signature checked later, by ``problem``)."""
    try:
        checkpoint = notes.parse_checkpoint(notes.parse_note(note).text)
    except notes.NoteError as exc:
        raise ValueError(f"{source} is not a checkpoint: {exc}") from None
    return Head(source, checkpoint.origin, checkpoint.size, checkpoint.root.hex(), note=note)


def in_database(first: int = 0) -> list[Head]:
    out = []
    for row in SignedTreeHead.objects.filter(tree_size__gte=first).order_by("tree_size", "id"):
        source = f"checkpoint #{row.pk} in the database"
        if row.note:
            out.append(Head(source, row.origin, row.tree_size, row.root_hash, note=row.note))
        else:
            out.append(Head(source, "", row.tree_size, row.root_hash, legacy=row.as_dict()))
    return out


def published(path: Path) -> list[Head]:
    """Every head in the published file (JSON lines), oldest first; unreadable lines are skipped
    and reported by ``published_notes``."""
    out: list[Head] = []
    if not path.is_file():
        return out
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            source = f"published checkpoint ({path}, line {lineno})"
            try:
                data = json.loads(line)
                if data.get("checkpoint"):
                    out.append(from_note(str(data["checkpoint"]), source))
                else:
                    out.append(
                        Head(source, "", int(data["tree_size"]), str(data["root_hash"]), legacy=dict(data))
                    )
            except (ValueError, KeyError, TypeError, AttributeError):
                out.append(Head(source, "?", -1, ""))
    return out


def choose(heads: list[Head], origin: str) -> tuple[list[Head], list[str]]:
    """This log's heads to check, and what is left unchecked (named, for the verdict)."""
    ours = [h for h in heads if h.origin == origin]
    skipped = [h for h in heads if h.origin != origin]
    notes_out = []
    by_origin = Counter(h.origin for h in skipped)
    for other, count in sorted(by_origin.items()):
        where = sorted(
            {
                h.source.split(", line")[0].removeprefix("published checkpoint (")
                for h in skipped
                if h.origin == other
            }
        )
        what = f"{count} head{'s' if count != 1 else ''} in {', '.join(where)}"
        if other == "":
            notes_out.append(
                f"not checked: {what} without an origin (from before checkpoints; cannot be told apart from another database's)"
            )
        elif other == "?":
            notes_out.append(f"not checked: {what} unreadable")
        else:
            notes_out.append(f"not checked: another log ({other}), {what}")
    return ours, notes_out


def to_check(origin: str, kept: Head | None, path: Path | None) -> tuple[list[Head], list[str]]:
    """This log's heads: every one in the database, the kept checkpoint's, the last published."""
    stored = in_database()
    ours = [h for h in stored if h.origin in (origin, "")]
    _, unchecked = choose([h for h in stored if h.origin not in (origin, "")], origin)
    checked = [
        f"log {origin}",
        f"checked: {len(ours)} checkpoint{'s' if len(ours) != 1 else ''} in the database",
    ]
    if kept is not None:
        ours.append(kept)  # another origin is refused by its signature check: the auditor chose it
        checked.append(f"{kept.source} at size {kept.size}")
    if path is not None:
        mine, others = choose(published(path), origin)
        unchecked += others
        if mine:
            last = max(mine, key=lambda h: h.size)
            ours.append(last)
            checked.append(f"{last.source} at size {last.size}")
        else:
            checked.append(f"no published checkpoint of this log in {path}")
    return ours, [*checked, *unchecked]


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint kept outside the log: ``seq``/``digest`` (the chain head, from
    ``audit_checkpoint``), and the signed tree head (``note``: a C2SP checkpoint; ``sth``: an
    HMAC head from before checkpoints). A bare checkpoint note (``/audit/log/checkpoint``) has no
    chain digest."""

    seq: int | None
    digest: str
    created_at: str = ""
    sth: dict[str, Any] | None = None
    note: str = ""
    source: str = "the checkpoint file"

    @classmethod
    def load(cls, path: str | Path) -> Checkpoint:
        raw = Path(path).read_text(encoding="utf-8")
        source = f"checkpoint file {path}"
        if not raw.lstrip().startswith("{"):
            return cls(None, "", note=raw, source=source)
        data = json.loads(raw)
        try:
            return cls(
                seq=int(data["seq"]),
                digest=str(data["digest"]),
                created_at=str(data.get("created_at", "")),
                sth=data.get("sth") if isinstance(data.get("sth"), dict) else None,
                note=str(data.get("checkpoint") or ""),
                source=source,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path} is not an audit checkpoint (needs seq and digest): {exc}") from exc

    def head(self) -> Head | None:
        if self.note:
            return from_note(self.note, self.source)
        if self.sth:
            return Head(
                self.source, "", int(self.sth["tree_size"]), str(self.sth["root_hash"]), legacy=self.sth
            )
        return None
