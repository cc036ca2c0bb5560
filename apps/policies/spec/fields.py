"""The spec's building blocks: the value types and bounds, the field declaration (`_f`), the base
of every section (`_Spec`), field metadata, the leaf parsers (exact messages) and the errors."""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Literal, TypeGuard, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

from apps.engine.text import has_bad_chars
from apps.policies.patterns import regex_problem

ConstraintAction = Literal["repair", "block"]
PartialAnswers = Literal["allow", "deny"]
# A plan that crosses a plan-check limit: wait for an approver, or end blocked at once.
HoldAction = Literal["require_approval", "block"]
BoundaryLabel = Literal["pii", "secrets"]
GuardAction = Literal["block", "redact", "warn", "require_review"]
OnCheckError = Literal["fail_closed", "fail_open"]
TermKind = Literal["keyword", "regex"]
# A tool call (issue 43): run it, hold it for an approver first, or refuse it.
ToolAction = Literal["allow", "require_approval", "block"]

PII_TYPES = ("email", "phone", "card", "iban", "national_id", "ip")
SECRET_TYPES = ("openai", "aws", "github", "slack", "private_key", "jwt", "generic")
STAGES = ("input", "step_output", "output")

# Higher = stricter, compared only within one field's choices (the `stricter` merge rule).
# Guardrail actions: block > require_review > redact > warn (distinct ranks: a tie would let the
# platform's weaker value stand). Constraint actions: block > repair.
STRICTNESS: dict[str, int] = {
    "warn": 1,
    "repair": 1,
    "redact": 2,
    "require_review": 3,
    "require_approval": 3,
    "block": 4,
    "fail_open": 1,
    "fail_closed": 2,
    "allow": 0,
    "deny": 2,
}

# Size bounds on what a policy may store (refused at save/publish with the field path).
MAX_PATTERN_CHARS = 500  # a keyword or a regular expression
MAX_TEXT_CHARS = 300  # names, messages, keys, tags: any text field without its own bound
MAX_PROMPT_CHARS = 4000  # a model judge's rule prompt
MAX_SCHEMA_CHARS = 64 * 1024  # the output JSON schema, serialised
MAX_LIST_ITEMS = 200

# The error type this module raises inside pydantic; its context carries (sub-path, message) pairs.
_ERROR_TYPE = "policy_spec"


def _f(default: Any, help: str, merge: str, *, required: bool = False, **extra: Any) -> Any:
    """A pydantic field: `description` is the help text, `json_schema_extra` carries the merge rule
    and the validator's bounds (`minimum`, `maximum`, `regex`, `choices`, `exclude`, `max_chars`,
    `stages`, `binds_with`), so the JSON schema the editor reads holds all of them."""
    meta = {"merge": merge, **extra}
    if required:  # no default: pydantic reports the missing key ("is required")
        return Field(description=help, json_schema_extra=meta)
    if isinstance(default, type) and issubclass(default, BaseModel):  # a section: a fresh instance
        return Field(default_factory=default, description=help, json_schema_extra=meta)
    return Field(default=default, description=help, json_schema_extra=meta)


class _Spec(BaseModel):
    """Base of every spec section: immutable, unknown keys refused by name, leaf values checked
    by this module (exact messages), objects and lists of objects by pydantic."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @field_validator("*", mode="wrap")
    @classmethod
    def _check_field(cls, value: Any, handler: Callable[[Any], Any], info: ValidationInfo) -> Any:
        assert info.field_name is not None
        return _parse_field(cls.model_fields[info.field_name], value, handler)

    @model_validator(mode="after")
    def _check_object(self) -> Any:
        problems = self._problems()
        if problems:
            raise _spec_error(problems)
        return self

    def _problems(self) -> Problems:
        """Rules that span several fields of this object (run once its fields are valid); the
        sections that have some override it."""
        return []


# ------------------------------------------------------------------------------------ validation


@dataclass(frozen=True, slots=True)
class FieldError:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class SpecError(ValueError):
    def __init__(self, errors: list[FieldError]) -> None:
        super().__init__("; ".join(str(e) for e in errors))
        self.errors = errors


# (path relative to where pydantic reports the error: "", "[3]" or "soft_usd", message)
Problems = list[tuple[str, str]]


def _spec_error(problems: Problems) -> PydanticCustomError:
    detail = "; ".join(f"{p}: {m}" if p else m for p, m in problems)
    return PydanticCustomError(_ERROR_TYPE, "{detail}", {"detail": detail, "problems": problems})


def _meta(f: FieldInfo) -> dict[str, Any]:
    extra = f.json_schema_extra
    return dict(extra) if isinstance(extra, dict) else {}


def field_meta(cls: type[BaseModel], name: str) -> dict[str, Any]:
    """A field's merge rule and bounds (its `json_schema_extra`)."""
    return _meta(cls.model_fields[name])


def is_section(tp: Any) -> TypeGuard[type[BaseModel]]:
    """True for a spec section type (a nested model), false for a leaf type."""
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _item_model(tp: Any) -> type[BaseModel] | None:
    """The entry model of a list-of-objects field (rules, terms, judges), else None."""
    args = get_args(tp)
    return args[0] if get_origin(tp) is tuple and args and is_section(args[0]) else None


@dataclass(frozen=True, slots=True)
class SpecField:
    """One field of a spec section: what the merge property test and the help read."""

    name: str
    type: Any
    help: str
    metadata: dict[str, Any]


def spec_fields(cls_or_obj: Any) -> list[SpecField]:
    """The fields of a spec section (a model class or instance), in declaration order."""
    cls: type[BaseModel] = cls_or_obj if isinstance(cls_or_obj, type) else type(cls_or_obj)
    return [SpecField(n, f.annotation, f.description or "", _meta(f)) for n, f in cls.model_fields.items()]


def _hints(cls: type[BaseModel]) -> dict[str, Any]:
    return {name: f.annotation for name, f in cls.model_fields.items()}


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _sub(path: str, sub: str) -> str:
    if not sub:
        return path
    return path + sub if sub.startswith("[") else _join(path, sub)


def _type_name(value: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "true/false", type(None): "null"}.get(
        type(value), type(value).__name__
    )


def _parse_field(f: FieldInfo, value: Any, handler: Callable[[Any], Any]) -> Any:
    """One field of a section: sections and entries of object lists go to pydantic (which reports
    their paths); leaves are checked here, so each message says exactly what is wrong."""
    tp = f.annotation
    if is_section(tp):
        return handler(value)
    if _item_model(tp) is not None:
        if not isinstance(value, list | tuple):
            raise _spec_error([("", f"must be a list, got {_type_name(value)}")])
        if len(value) > MAX_LIST_ITEMS:
            raise _spec_error([("", f"has {len(value)} entries; at most {MAX_LIST_ITEMS} are allowed")])
        out: list[Any] = []
        for entry in handler(value):
            if entry not in out:
                out.append(entry)
        return tuple(out)
    problems: Problems = []
    parsed = _parse_value(tp, value, "", {**_meta(f), "required": f.is_required()}, problems)
    if problems:
        raise _spec_error(problems)
    return parsed


def _parse_value(tp: Any, value: Any, path: str, meta: Mapping[str, Any], problems: Problems) -> Any:
    origin = get_origin(tp)
    args = get_args(tp)
    if origin in (typing.Union, types.UnionType):
        non_none = [a for a in args if a is not type(None)]
        if value is None:
            return None
        return _parse_value(non_none[0], value, path, meta, problems)
    if origin is Literal:
        if value not in args:
            problems.append((path, f"must be one of {', '.join(map(str, args))}; got {value!r}"[:300]))
            return None
        excluded = meta.get("exclude", ())
        if value in excluded:
            allowed = [a for a in args if a not in excluded]
            problems.append((path, f"{value!r} is not available for this check; choose {', '.join(allowed)}"))
            return None
        return value
    if tp is bool:
        if not isinstance(value, bool):
            problems.append((path, f"must be true or false, got {_type_name(value)}"))
            return None
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append((path, f"must be a whole number, got {value!r}"[:200]))
            return None
        return _bounds(value, path, meta, problems)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            problems.append((path, f"must be a number, got {value!r}"[:200]))
            return None
        return _bounds(float(value), path, meta, problems)
    if tp is Decimal:
        return _parse_decimal(value, path, meta, problems)
    if tp is str:
        return _parse_text(value, path, meta, problems)
    if origin is tuple:
        return _parse_list(args[0], value, path, meta, problems)
    if origin is dict:
        if not isinstance(value, dict):
            problems.append((path, f"must be an object, got {_type_name(value)}"))
            return None
        problem = _json_schema_problem(value)  # the one object-valued leaf: the output JSON schema
        if problem:
            problems.append((path, problem))
        return value
    raise TypeError(f"unsupported spec type {tp!r} at {path}")  # a bug in this module, not user input


def _parse_decimal(value: Any, path: str, meta: Mapping[str, Any], problems: Problems) -> Any:
    bad = f'must be an amount in USD, e.g. 5 or "2.50"; got {value!r}'[:200]
    # A Decimal comes back when a parsed spec is validated again (model_copy, merge results).
    if isinstance(value, bool) or not isinstance(value, int | float | str | Decimal):
        problems.append((path, bad))
        return None
    try:
        dec = Decimal(str(value))
    except InvalidOperation:
        problems.append((path, bad))
        return None
    if not dec.is_finite():
        problems.append((path, "must be a finite amount"))
        return None
    return _bounds(dec, path, meta, problems)


def _parse_text(value: Any, path: str, meta: Mapping[str, Any], problems: Problems) -> Any:
    if not isinstance(value, str):
        problems.append((path, f"must be a string, got {_type_name(value)}"))
        return None
    limit = meta.get("max_chars") or (MAX_PATTERN_CHARS if meta.get("regex") else MAX_TEXT_CHARS)
    if len(value) > limit:
        problems.append((path, f"is {len(value)} characters long; at most {limit} are allowed"))
        return None
    if has_bad_chars(value):
        problems.append((path, "must not contain NUL characters or unpaired surrogates"))
        return None
    if meta.get("required") and not value.strip():
        problems.append((path, "must not be empty"))
        return None
    if meta.get("regex"):
        problem = _regex_problem(value)
        if problem:
            problems.append((path, problem))
    return value


def _parse_list(item_tp: Any, value: Any, path: str, meta: Mapping[str, Any], problems: Problems) -> Any:
    if not isinstance(value, list | tuple):
        problems.append((path, f"must be a list, got {_type_name(value)}"))
        return None
    if len(value) > MAX_LIST_ITEMS:
        problems.append((path, f"has {len(value)} entries; at most {MAX_LIST_ITEMS} are allowed"))
        return None
    out: list[Any] = []
    choices = meta.get("choices")
    item_meta = {k: v for k, v in meta.items() if k in ("regex",)}
    for i, item in enumerate(value):
        p = _join(path, i)
        if item_tp is str and isinstance(item, str) and not item.strip():
            problems.append((p, "must not be empty"))
            continue
        before = len(problems)
        parsed = _parse_value(item_tp, item, p, item_meta, problems)
        if parsed is None or len(problems) > before:
            continue
        if choices is not None and parsed not in choices:
            problems.append((p, f"unknown value {parsed!r}; choose from {', '.join(choices)}"[:300]))
            continue
        if parsed not in out:
            out.append(parsed)
    return tuple(out)


def _bounds(value: Any, path: str, meta: Mapping[str, Any], problems: Problems) -> Any:
    lo, hi = meta.get("minimum"), meta.get("maximum")
    if lo is not None and value < lo:
        problems.append((path, f"must be at least {lo}, got {value}"))
        return None
    if hi is not None and value > hi:
        problems.append((path, f"must be at most {hi}, got {value}"))
        return None
    return value


def _regex_problem(pattern: str) -> str | None:
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"the pattern is longer than {MAX_PATTERN_CHARS} characters"
    # Policy patterns run on RE2 (linear time); what RE2 refuses cannot be published.
    problem = regex_problem(pattern)
    if problem is not None:
        return f"invalid regular expression for RE2 (linear-time matching): {problem}"[:300]
    return None


def _json_schema_problem(schema: dict[str, Any]) -> str | None:
    import jsonschema

    try:
        size = len(json.dumps(schema))
    except (TypeError, ValueError, RecursionError):
        return "must be a JSON object"
    if size > MAX_SCHEMA_CHARS:
        return f"is {size} characters as JSON; at most {MAX_SCHEMA_CHARS} are allowed"
    stack: list[Any] = [schema]
    while stack:  # iterative: the loaders bound the depth, this must not recurse on it either
        node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, value in items:
            if (isinstance(key, str) and has_bad_chars(key)) or (
                isinstance(value, str) and has_bad_chars(value)
            ):
                return "must not contain NUL characters or unpaired surrogates"
            if isinstance(value, dict | list):
                stack.append(value)
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as err:
        where = "/".join(str(p) for p in err.path)
        return f"invalid JSON schema{(' at ' + where) if where else ''}: {err.message}"[:300]
    return None
