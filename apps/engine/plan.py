"""The plan model and the parser for what conductor models really emit.

A plan is three parallel lists (Conductor paper, arXiv 2512.04388):

    model_id    = [2, 0, 1]                       # which worker runs each step
    subtasks    = ["Draft ...", "Check ...", "Answer ..."]
    access_list = [[], [0], "all"]                # earlier outputs each step may read

Step `i` may read `[]`, a list of earlier step indices, or `"all"` (every earlier step).
The last step's output is the answer.

**The conductor itself.** In a `Plan` the constant `CONDUCTOR_SELF` (= -1) names the conductor:
that step re-plans with the results so far (recursive test-time scaling). In text the conductor
may write either -1 or `pool_size` — the prompt lists the conductor as the entry after the last
worker, which small models follow more reliably than a negative id. It may only be the *last*
step of a plan (it decides what happens next, so nothing can come after it in the same round).

**Global indices.** Re-plans append steps after the earlier rounds' steps. `parse_plan(...,
index_offset=n)` numbers the new steps n, n+1, ...; their access lists use the same global
numbers and may name any earlier step (0..n-1 from earlier rounds, or earlier steps of the same
plan). The re-plan prompt presents the results with these numbers.

Parsing never evaluates code: list literals go through `ast.literal_eval` and objects through
`json`; deep nesting, huge numbers and oversized input become `PlanError`, never anything else.
"""

from __future__ import annotations

import ast
import json
import re
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

CONDUCTOR_SELF = -1
MAX_PLAN_TEXT = 64 * 1024  # characters; conductor replies are a few hundred
MAX_INSTRUCTION_CHARS = 8000
_MAX_JSON_ATTEMPTS = 256  # bounds the work spent on prose full of braces

Access = tuple[int, ...] | Literal["all"]


class PlanError(ValueError):
    """An invalid plan; the message says which list, which index and what was wrong."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True, slots=True)
class PlanStep:
    index: int  # global index (unique across recursion rounds)
    worker: int  # pool index, or CONDUCTOR_SELF
    instruction: str
    access: Access
    # A chat to send as it is instead of the built context (a pool model's tool conversation).
    messages: tuple[dict[str, Any], ...] | None = None
    # The step's tool access list (issue 43): the tools (<server>.<tool>) its worker may call.
    # Empty: none. The policy may still narrow it; it can never widen it.
    tools: tuple[str, ...] = ()

    @property
    def is_self(self) -> bool:
        return self.worker == CONDUCTOR_SELF

    def reads(self) -> tuple[int, ...]:
        """The concrete earlier step indices this step may read."""
        if self.access == "all":
            return tuple(range(self.index))
        return self.access


@dataclass(frozen=True, slots=True)
class Plan:
    steps: tuple[PlanStep, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.steps, tuple):
            object.__setattr__(self, "steps", tuple(self.steps))

    def __len__(self) -> int:
        return len(self.steps)

    def __iter__(self) -> Iterator[PlanStep]:
        return iter(self.steps)

    @property
    def last(self) -> PlanStep:
        return self.steps[-1]

    @property
    def first_index(self) -> int:
        return self.steps[0].index if self.steps else 0

    @property
    def recurses(self) -> bool:
        return bool(self.steps) and self.steps[-1].is_self


# ----------------------------------------------------------------------------- validation

_WORKER_KEYS = ("model_id", "worker_ids", "workers", "worker_id", "model_ids")
_INSTRUCTION_KEYS = ("subtasks", "instructions", "subtask")
_ACCESS_KEYS = ("access_list", "access", "access_lists")


def _describe_ids(pool_size: int, allow_self: bool) -> str:
    ids = f"0..{pool_size - 1}" if pool_size > 1 else "0"
    if allow_self:
        return f"{ids}, or {pool_size} (or -1) for the conductor itself"
    return ids


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def build_plan(
    model_id: object,
    subtasks: object,
    access_list: object,
    *,
    pool_size: int,
    max_steps: int = 5,
    allow_self: bool = True,
    index_offset: int = 0,
) -> Plan:
    """Validate three raw lists (from any source) and build a `Plan`, or raise `PlanError`."""
    if pool_size < 1:
        raise PlanError("the worker pool is empty")
    lists = {"model_id": model_id, "subtasks": subtasks, "access_list": access_list}
    for name, value in lists.items():
        if not isinstance(value, list | tuple):
            raise PlanError(f"{name} must be a list, got {type(value).__name__}")
    assert isinstance(model_id, list | tuple)
    assert isinstance(subtasks, list | tuple)
    assert isinstance(access_list, list | tuple)
    lengths = (len(model_id), len(subtasks), len(access_list))
    if len(set(lengths)) != 1:
        raise PlanError(
            "model_id, subtasks and access_list must have the same length, got "
            f"{lengths[0]}, {lengths[1]} and {lengths[2]}"
        )
    n = lengths[0]
    if n == 0:
        raise PlanError("the plan has no steps: model_id, subtasks and access_list are empty")
    if n > max_steps:
        raise PlanError(f"the plan has {n} steps; at most {max_steps} are allowed")

    steps: list[PlanStep] = []
    for i in range(n):
        g = index_offset + i
        worker = model_id[i]
        if not _is_int(worker):
            raise PlanError(f"model_id[{i}]: worker ids must be integers, got {worker!r}"[:300])
        assert isinstance(worker, int)
        if worker in (CONDUCTOR_SELF, pool_size):
            if not allow_self:
                raise PlanError(
                    f"model_id[{i}]: the conductor itself ({worker}) may not be used here "
                    "(recursion is off or the depth limit is reached)"
                )
            if i != n - 1:
                raise PlanError(f"model_id[{i}]: the conductor itself may only be the last step")
            worker = CONDUCTOR_SELF
        elif not 0 <= worker < pool_size:
            raise PlanError(
                f"model_id[{i}]: unknown worker id {worker} (valid ids: {_describe_ids(pool_size, allow_self)})"
            )

        instruction = subtasks[i]
        if not isinstance(instruction, str):
            raise PlanError(f"subtasks[{i}]: instructions must be strings, got {type(instruction).__name__}")
        instruction = _clean_text(instruction).strip()
        if not instruction:
            raise PlanError(f"subtasks[{i}]: the instruction is empty")
        if len(instruction) > MAX_INSTRUCTION_CHARS:
            raise PlanError(
                f"subtasks[{i}]: the instruction is longer than {MAX_INSTRUCTION_CHARS} characters"
            )

        steps.append(PlanStep(g, worker, instruction, _validate_access(access_list[i], i, g)))
    return Plan(tuple(steps))


def _validate_access(raw: object, i: int, g: int) -> Access:
    if isinstance(raw, str):
        if raw.strip().lower() == "all":
            return "all"
        raise PlanError(
            f'access_list[{i}]: expected [], a list of earlier step indices or "all", got {raw!r}'[:300]
        )
    if not isinstance(raw, list | tuple):
        raise PlanError(
            f'access_list[{i}]: expected [], a list of earlier step indices or "all", got {type(raw).__name__}'
        )
    seen: set[int] = set()
    for j, ref in enumerate(raw):
        if not _is_int(ref):
            raise PlanError(f"access_list[{i}][{j}]: step indices must be integers, got {ref!r}"[:300])
        assert isinstance(ref, int)
        if ref == g:
            raise PlanError(f"access_list[{i}]: step {g} cannot read its own output")
        if ref > g:
            raise PlanError(f"access_list[{i}]: step {g} cannot read step {ref}, which runs later")
        if ref < 0:
            raise PlanError(f"access_list[{i}][{j}]: step indices cannot be negative, got {ref}")
        seen.add(ref)
    return tuple(sorted(seen))


def validate_plan(plan: Plan, *, pool_size: int, max_steps: int = 5, allow_self: bool = True) -> Plan:
    """Re-check a Plan built elsewhere (e.g. a governance repair) with the parser's rules."""
    if not plan.steps:
        raise PlanError("the plan has no steps")
    offset = plan.steps[0].index
    for i, step in enumerate(plan.steps):
        if step.index != offset + i:
            raise PlanError(f"step {i}: index {step.index} breaks the numbering (expected {offset + i})")
    return build_plan(
        [s.worker for s in plan.steps],
        [s.instruction for s in plan.steps],
        [s.access if s.access == "all" else list(s.access) for s in plan.steps],
        pool_size=pool_size,
        max_steps=max_steps,
        allow_self=allow_self,
        index_offset=offset,
    )


# ----------------------------------------------------------------------------- text extraction

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


def _clean_text(text: str) -> str:
    # Lone surrogates cannot be stored or sent as UTF-8; make them U+FFFD instead of failing later.
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


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

MAX_STEP_TOOLS = 20
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,50}\.[A-Za-z0-9_.-]{1,128}$")
_TOOL_ACCESS_KEYS = ("tool_access", "tool_access_list", "tool_access_lists", "tools")
_TOOL_LITERAL = re.compile(r"(?<![\w.])tool_access(?:_lists?)?\s*=\s*\[")


def _tool_entry(raw: object) -> tuple[str, ...]:
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list):
        return ()
    names = [n.strip() for n in raw if isinstance(n, str) and _TOOL_NAME.match(n.strip())]
    return tuple(dict.fromkeys(names))[:MAX_STEP_TOOLS]


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
            inner = obj.get("plan") if isinstance(obj.get("plan"), dict) else obj
            has, value = _lookup(inner, _TOOL_ACCESS_KEYS[:3])
            if has:
                found = value
                continue
            steps = inner.get("steps")
            if isinstance(steps, list) and any(isinstance(s, dict) and "tools" in s for s in steps):
                found = [s.get("tools") if isinstance(s, dict) else None for s in steps]
    if not isinstance(found, list):
        return None
    return [_tool_entry(entry) for entry in found]


def with_tool_access(plan: Plan, access: Sequence[Sequence[str]] | None) -> Plan:
    """The plan with each step's tool access list (by position; missing entries grant nothing)."""
    if not access:
        return plan
    steps = [
        replace(step, tools=tuple(access[i])) if i < len(access) and not step.is_self else step
        for i, step in enumerate(plan.steps)
    ]
    return Plan(tuple(steps))


# ----------------------------------------------------------------------------- schema & serialisation


def plan_json_schema(
    pool_size: int,
    max_steps: int = 5,
    *,
    allow_self: bool = True,
    strict: bool = False,
    max_instruction_chars: int | None = None,
    shape: Literal["lists", "steps"] = "lists",
    tools: Sequence[str] = (),
) -> dict:
    """JSON schema for constrained decoding of a plan object: the three lists (``lists``), or
    ``{"steps": [{"worker", "subtask", "access"}]}`` (``steps``). `strict=True` keeps only the
    keywords OpenAI strict structured outputs accept (no minItems/maxItems/minLength).
    `max_instruction_chars` bounds each subtask string, so a grammar-constrained small model
    cannot ramble until max_tokens cuts the JSON off unterminated."""
    ids = list(range(pool_size)) + ([pool_size] if allow_self else [])
    ints: dict[str, Any] = {"type": "integer", "enum": ids}
    text: dict[str, Any] = {"type": "string"}
    index: dict[str, Any] = {"type": "integer"}
    if not strict:
        text["minLength"] = 1
        index["minimum"] = 0
        if max_instruction_chars is not None:
            text["maxLength"] = max_instruction_chars

    def arr(items: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "array", "items": items}
        if not strict:
            out["minItems"] = 1
            out["maxItems"] = max_steps
        return out

    access_item = {"anyOf": [{"type": "string", "enum": ["all"]}, {"type": "array", "items": index}]}
    if shape == "steps":
        # One object per step: equal list lengths hold by construction, which three parallel
        # arrays cannot express in JSON schema (small grammar-constrained models get it wrong).
        step: dict[str, Any] = {
            "type": "object",
            "properties": {"worker": ints, "subtask": text, "access": access_item},
            "required": ["worker", "subtask", "access"],
            "additionalProperties": False,
        }
        if tools:
            # The step's tool access list (issue 43): only names the run may grant.
            step["properties"]["tools"] = {"type": "array", "items": {"type": "string", "enum": list(tools)}}
            if strict:
                step["required"].append("tools")  # strict structured outputs require every key
        return {
            "type": "object",
            "properties": {"steps": arr(step)},
            "required": ["steps"],
            "additionalProperties": False,
        }
    return {
        "type": "object",
        "properties": {
            "model_id": arr(ints),
            "subtasks": arr(text),
            "access_list": arr(access_item),
        },
        "required": ["model_id", "subtasks", "access_list"],
        "additionalProperties": False,
    }


def plan_to_dict(
    plan: Plan,
    worker_keys: Sequence[str] | None = None,
    *,
    conductor_key: str | None = None,
) -> dict[str, Any]:
    """JSON-safe form used in events and persistence; `worker_key` is filled when keys are given."""

    def key(worker: int) -> str | None:
        if worker == CONDUCTOR_SELF:
            return conductor_key
        if worker_keys is not None and 0 <= worker < len(worker_keys):
            return worker_keys[worker]
        return None

    return {
        "steps": [
            {
                "index": s.index,
                "worker": s.worker,
                "worker_key": key(s.worker),
                "instruction": s.instruction,
                "access": "all" if s.access == "all" else list(s.access),
                # Only when granted, so a plan without tools keeps its stored form (and digest).
                **({"tools": list(s.tools)} if s.tools else {}),
            }
            for s in plan.steps
        ]
    }


def plan_from_dict(data: Mapping[str, Any]) -> Plan:
    """Rebuild a Plan from `plan_to_dict` output; raises PlanError on malformed data."""
    steps_raw = data.get("steps") if isinstance(data, Mapping) else None
    if not isinstance(steps_raw, list) or not steps_raw:
        raise PlanError("plan data must have a non-empty 'steps' list")
    steps: list[PlanStep] = []
    for i, s in enumerate(steps_raw):
        if not isinstance(s, Mapping):
            raise PlanError(f"steps[{i}] must be an object")
        index, worker, instruction, access = (
            s.get("index"),
            s.get("worker"),
            s.get("instruction"),
            s.get("access"),
        )
        if not _is_int(index) or not _is_int(worker):
            raise PlanError(f"steps[{i}]: index and worker must be integers")
        if not isinstance(instruction, str) or not instruction.strip():
            raise PlanError(f"steps[{i}]: instruction must be a non-empty string")
        assert isinstance(index, int) and isinstance(worker, int)
        if access == "all":
            acc: Access = "all"
        elif isinstance(access, list) and all(_is_int(a) and 0 <= a < index for a in access):
            acc = tuple(sorted(set(access)))
        else:
            raise PlanError(f"steps[{i}]: access must be 'all' or a list of earlier step indices")
        if i and index != steps[-1].index + 1:
            raise PlanError(f"steps[{i}]: indices must be consecutive")
        steps.append(PlanStep(index, worker, instruction, acc, tools=_tool_entry(s.get("tools"))))
    return Plan(tuple(steps))


def plan_to_text(plan: Plan, *, pool_size: int | None = None) -> str:
    """The three-list text form (as the paper writes it); the conductor is written as
    `pool_size` when given, since that is how the prompt lists it."""
    self_id = pool_size if pool_size is not None else CONDUCTOR_SELF
    workers = [self_id if s.is_self else s.worker for s in plan.steps]
    access = ["all" if s.access == "all" else list(s.access) for s in plan.steps]
    text = (
        f"model_id = {workers!r}\n"
        f"subtasks = {json.dumps([s.instruction for s in plan.steps], ensure_ascii=False)}\n"
        f"access_list = {json.dumps(access)}"
    )
    if any(s.tools for s in plan.steps):
        text += f"\ntool_access = {json.dumps([list(s.tools) for s in plan.steps])}"
    return text


def single_step_plan(worker: int, instruction: str, *, index_offset: int = 0, access: Access = ()) -> Plan:
    return Plan((PlanStep(index_offset, worker, instruction, access),))
