"""Parse an uploaded JSONL evaluation set. Pure: no Django, so every rule is testable on bytes.

Each line is ``{"messages": [{"role", "content"}, ...], "reference": "...", "tags": [...]}`` or the
shorthand ``{"input": "question", ...}``. The whole file is refused when any line is bad, and the
refusal lists every bad line as ``line N: <reason>`` so the author can fix them all at once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

MAX_FILE_BYTES = 5 * 1024 * 1024
MAX_LINES = 2_000
MAX_QUESTION_CHARS = 20_000
MAX_REFERENCE_CHARS = 20_000
MAX_TAGS = 20
MAX_TAG_CHARS = 40
MAX_REPORTED = 50  # a file of 2,000 bad lines should not become a 2,000-line error page
ROLES = ("system", "user", "assistant")
KNOWN_KEYS = {"messages", "input", "reference", "tags"}


@dataclass(frozen=True)
class ParsedItem:
    index: int  # the 1-based line number it came from
    messages: list[dict[str, str]]
    reference: str | None
    tags: list[str] = field(default_factory=list)


class DatasetInvalid(ValueError):
    """The upload was refused; ``errors`` are the ``line N: reason`` strings (or file-level ones)."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__("; ".join(errors))


def _messages(row: dict[str, Any]) -> list[dict[str, str]]:
    if "messages" in row and "input" in row:
        raise ValueError('give either "messages" or "input", not both')
    if "input" in row:
        text = row["input"]
        if not isinstance(text, str):
            raise ValueError(f'"input" must be a string, got {type(text).__name__}')
        if not text.strip():
            raise ValueError('"input" is empty')
        return [{"role": "user", "content": text}]
    if "messages" not in row:
        raise ValueError('missing "messages" (or the "input" shorthand)')
    msgs = row["messages"]
    if not isinstance(msgs, list) or not msgs:
        raise ValueError('"messages" must be a non-empty list of {"role", "content"} objects')
    out: list[dict[str, str]] = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise ValueError(f"messages[{i}] must be an object with role and content")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise ValueError(f"messages[{i}].role must be one of {', '.join(ROLES)}")
        if not isinstance(content, str):
            raise ValueError(f"messages[{i}].content must be a string")
        if not content.strip():
            raise ValueError(f"messages[{i}].content is empty")
        out.append({"role": role, "content": content})
    if out[-1]["role"] != "user":
        raise ValueError("the last message must be the user's question (role user)")
    return out


def _row(row: Any, index: int) -> ParsedItem:
    if not isinstance(row, dict):
        raise ValueError(f"each line must be a JSON object, got {type(row).__name__}")
    unknown = sorted(set(row) - KNOWN_KEYS)
    if unknown:
        raise ValueError(f"unknown field {unknown[0]!r} (allowed: input, messages, reference, tags)")
    messages = _messages(row)
    size = sum(len(m["content"]) for m in messages)
    if size > MAX_QUESTION_CHARS:
        raise ValueError(f"the question is {size:,} characters; the limit is {MAX_QUESTION_CHARS:,}")
    reference = row.get("reference")
    if reference is not None:
        if not isinstance(reference, str):
            raise ValueError(f'"reference" must be a string, got {type(reference).__name__}')
        if len(reference) > MAX_REFERENCE_CHARS:
            raise ValueError(f'"reference" is longer than {MAX_REFERENCE_CHARS:,} characters')
    tags = row.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) and t.strip() for t in tags):
        raise ValueError('"tags" must be a list of non-empty strings')
    if len(tags) > MAX_TAGS or any(len(t) > MAX_TAG_CHARS for t in tags):
        raise ValueError(f"at most {MAX_TAGS} tags of at most {MAX_TAG_CHARS} characters each")
    return ParsedItem(index=index, messages=messages, reference=reference, tags=[t.strip() for t in tags])


def parse_jsonl(data: bytes) -> list[ParsedItem]:
    """Every item of the file, or DatasetInvalid listing every bad line (blank lines are skipped)."""
    if len(data) > MAX_FILE_BYTES:
        raise DatasetInvalid([f"the file is {len(data):,} bytes; the limit is {MAX_FILE_BYTES:,} (5 MB)"])
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        bad_line = data[: err.start].count(b"\n") + 1
        raise DatasetInvalid([f"line {bad_line}: not UTF-8 text"]) from None
    lines = text.splitlines()
    filled = [(n, line) for n, line in enumerate(lines, start=1) if line.strip()]
    if not filled:
        raise DatasetInvalid(["the file has no lines: upload one JSON object per line"])
    if len(filled) > MAX_LINES:
        raise DatasetInvalid([f"the file has {len(filled):,} lines; the limit is {MAX_LINES:,}"])
    items: list[ParsedItem] = []
    errors: list[str] = []
    for n, line in filled:
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            errors.append(f"line {n}: invalid JSON ({err.msg} at column {err.colno})")
            continue
        try:
            items.append(_row(row, n))
        except ValueError as err:
            errors.append(f"line {n}: {err}")
    if errors:
        extra = len(errors) - MAX_REPORTED
        shown = errors[:MAX_REPORTED]
        if extra > 0:
            shown.append(f"… and {extra} more bad lines")
        raise DatasetInvalid(shown)
    return items
