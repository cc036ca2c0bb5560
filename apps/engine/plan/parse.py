"""The parser for what conductor models really emit: the last complete plan in a reply.

Python list assignments (fenced or in prose), a JSON object with the three lists, or a JSON
``steps`` list; and beside it the per-step tool access lists (issue 43). Parsing never evaluates
code: list literals go through `ast.literal_eval` and objects through `json`; deep nesting, huge
numbers and oversized input become `PlanError`, never anything else.
"""

from __future__ import annotations

import ast
import json
import re
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from apps.engine.plan.model import MAX_PLAN_TEXT, Plan, PlanError, build_plan, tool_entry, with_tool_access

_MAX_JSON_ATTEMPTS = 256  # bounds the work spent on prose full of braces

_WORKER_KEYS = ("model_id", "worker_ids", "workers", "worker_id", "model_ids")
_INSTRUCTION_KEYS = ("subtasks", "instructions", "subtask")
_ACCESS_KEYS = ("access_list", "access", "access_lists")

_ASSIGN_RE = re.compile(
    r"(?<![\w.])(model_ids?|worker_ids?|workers|subtasks|instructions|access_lists?)\s*(?::[^=\n]{0,40})?=\s*\[",
    re.IGNORECASE,
)
_CANONICAL = {
    "model_id": "model_id",
    "model_ids": "model_id",
    "worker_id": "model_id",
    "worker_ids": "model_id",
    "workers": "model_id",
    "subtasks": "subtasks",
    "instructions": "subtasks",
    "access_list": "access_list",
    "access_lists": "access_list",
}


def _match_bracket(text: str, start: int) -> int | None:
    """Index just past the `]` matching the `[` at `start`, skipping Python/JSON string
    literals and comments; None when the literal is unterminated."""
    depth = 0
    i = start
    n = len(text)
    while i < n:
        c = text[i]
        if c in "\"'":
            triple = text[i : i + 3] in ('"""', "'''")
            quote = text[i : i + 3] if triple else c
            i += len(quote)
            while i < n:
                if text[i] == "\\":
                    i += 2
                    continue
                if text.startswith(quote, i):
                    i += len(quote)
                    break
                i += 1
            else:
                return None
            continue
        if c == "#":
            nl = text.find("\n", i)
            if nl < 0:
                return None
            i = nl
            continue
        if c in "[({":
            depth += 1
        elif c in "])}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def _safe_literal(src: str) -> tuple[bool, Any]:
    # JSON first: models often write JSON inside Python assignments, and JSON's "\\ud83d\\ude00"
    # surrogate-pair escapes only combine into one character when decoded as JSON.
    try:
        return True, json.loads(src, strict=False)
    except (ValueError, RecursionError):
        pass
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escapes in model output are not our warnings
            return True, ast.literal_eval(src)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError, OverflowError):
        return False, None


@dataclass(slots=True)
class _Candidate:
    end: int
    lists: tuple[object, object, object]


def _python_candidates(text: str, problems: dict[str, str]) -> Iterator[_Candidate]:
    latest: dict[str, tuple[int, object, bool]] = {}
    for m in _ASSIGN_RE.finditer(text):
        name = _CANONICAL[m.group(1).lower()]
        lb = m.end() - 1
        end = _match_bracket(text, lb)
        if end is None:
            latest.pop(name, None)  # a truncated final list must not be mixed with an older one
            problems[name] = f"{name} is unterminated (no closing bracket)"
            continue
        ok, value = _safe_literal(text[lb:end])
        latest[name] = (end, value, ok)
        if ok:
            problems.pop(name, None)
        else:
            problems[name] = (
                f"{name} is not a plain list literal (only numbers, strings and lists are allowed)"
            )
        if len(latest) == 3 and all(v[2] for v in latest.values()):
            yield _Candidate(
                max(v[0] for v in latest.values()),
                (latest["model_id"][1], latest["subtasks"][1], latest["access_list"][1]),
            )


def _lookup(obj: Mapping[str, Any], keys: Sequence[str]) -> tuple[bool, Any]:
    lowered = {k.lower(): v for k, v in obj.items() if isinstance(k, str)}
    for key in keys:
        if key in lowered:
            return True, lowered[key]
    return False, None


def _lists_from_object(obj: object, depth: int = 0) -> tuple[object, object, object] | None:
    if not isinstance(obj, dict) or depth > 2:
        return None
    has_w, workers = _lookup(obj, _WORKER_KEYS)
    has_i, instructions = _lookup(obj, _INSTRUCTION_KEYS)
    has_a, access = _lookup(obj, _ACCESS_KEYS)
    if has_w and has_i and has_a:
        return workers, instructions, access
    has_s, steps = _lookup(obj, ("steps",))
    if has_s and isinstance(steps, list) and steps and all(isinstance(s, dict) for s in steps):
        # [{"worker": 0, "instruction": "...", "access": []}, ...] — a shape models also produce.
        w: list[object] = []
        ins: list[object] = []
        acc: list[object] = []
        for s in steps:
            ok_w, sw = _lookup(s, ("worker", "model_id", "worker_id"))
            ok_i, si = _lookup(s, ("instruction", "subtask", "task"))
            ok_a, sa = _lookup(s, ("access", "access_list"))
            if not (ok_w and ok_i):
                return None
            w.append(sw)
            ins.append(si)
            acc.append(sa if ok_a else [])
        return w, ins, acc
    has_p, inner = _lookup(obj, ("plan", "workflow"))
    if has_p:
        return _lists_from_object(inner, depth + 1)
    return None


_OBJ_START = re.compile(r"\{\s*\"")


def _json_candidates(text: str) -> Iterator[_Candidate]:
    decoder = json.JSONDecoder(strict=False)  # small models put raw newlines inside strings
    attempts = 0
    pos = 0
    while attempts < _MAX_JSON_ATTEMPTS:
        m = _OBJ_START.search(text, pos)
        if m is None:
            return
        attempts += 1
        try:
            obj, end = decoder.raw_decode(text, m.start())
        except (ValueError, RecursionError):
            pos = m.start() + 1
            continue
        lists = _lists_from_object(obj)
        if lists is not None:
            yield _Candidate(end, lists)
            pos = end
        else:
            pos = m.start() + 1


def extract_plan_lists(text: str) -> tuple[object, object, object]:
    """Find the last complete plan in `text` (Python lists or a JSON object, fenced or in
    prose) and return its three raw lists, unvalidated."""
    if not isinstance(text, str):
        raise PlanError(f"the plan must be text, got {type(text).__name__}")
    if len(text) > MAX_PLAN_TEXT:
        raise PlanError(f"the plan text is {len(text)} characters; the limit is {MAX_PLAN_TEXT}")
    best: _Candidate | None = None
    problems: dict[str, str] = {}
    for cand in _python_candidates(text, problems):
        if best is None or cand.end >= best.end:
            best = cand
    for cand in _json_candidates(text):
        if best is None or cand.end >= best.end:
            best = cand
    if best is None:
        found = {_CANONICAL[m.group(1).lower()] for m in _ASSIGN_RE.finditer(text)}
        missing = [k for k in ("model_id", "subtasks", "access_list") if k not in found]
        if found and missing:
            raise PlanError(f"no complete plan found: missing {', '.join(missing)}")
        if problems:
            raise PlanError("no complete plan found: " + "; ".join(problems.values()))
        if found:
            raise PlanError("no complete plan found: a list is not a plain literal")
        raise PlanError("no plan found: expected model_id, subtasks and access_list lists")
    return best.lists


def parse_plan(
    text: str,
    *,
    pool_size: int,
    max_steps: int = 5,
    allow_self: bool = True,
    index_offset: int = 0,
) -> Plan:
    """Parse a conductor reply into a validated Plan, or raise `PlanError` (and only that)."""
    workers, instructions, access = extract_plan_lists(text)
    plan = build_plan(
        workers,
        instructions,
        access,
        pool_size=pool_size,
        max_steps=max_steps,
        allow_self=allow_self,
        index_offset=index_offset,
    )
    return with_tool_access(plan, extract_tool_access(text))


# ----------------------------------------------------------------------------- tool access (issue 43)

# ----------------------------------------------------------------------------- tool access (issue 43)

_TOOL_ACCESS_KEYS = ("tool_access", "tool_access_list", "tool_access_lists", "tools")
_TOOL_LITERAL = re.compile(r"(?<![\w.])tool_access(?:_lists?)?\s*=\s*\[")


def extract_tool_access(text: str) -> list[tuple[str, ...]] | None:
    """The per-step tool access lists a conductor wrote beside its plan, or None when it wrote
    none: ``tool_access = [[...], ...]`` (the list form), a ``tool_access`` key in the JSON object,
    or a ``tools`` key per step in the ``steps`` form. Anything malformed grants nothing (a
    step without a readable list gets no tools)."""
    decoder = json.JSONDecoder()
    found: object = None
    for m in _TOOL_LITERAL.finditer(text):
        try:
            found, _ = decoder.raw_decode(text, m.end() - 1)
        except ValueError:
            continue
    if found is None:
        for m in _OBJ_START.finditer(text):
            try:
                obj, _ = decoder.raw_decode(text, m.start())
            except ValueError:
                continue
            if not isinstance(obj, dict):
                continue
            nested = obj.get("plan")
            inner: dict[str, Any] = nested if isinstance(nested, dict) else obj
            has, value = _lookup(inner, _TOOL_ACCESS_KEYS[:3])
            if has:
                found = value
                continue
            steps = inner.get("steps")
            if isinstance(steps, list) and any(isinstance(s, dict) and "tools" in s for s in steps):
                found = [s.get("tools") if isinstance(s, dict) else None for s in steps]
    if not isinstance(found, list):
        return None
    return [tool_entry(entry) for entry in found]
