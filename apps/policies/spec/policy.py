"""The whole spec (`PolicySpec`), its validation into dotted-path `FieldError`s, its JSON Schema
(the editor's source) and its serialisation."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from functools import cache
from typing import Any

from pydantic import (
    BaseModel,
    ValidationError,
)

from apps.policies.spec.constraints import Budgets, Constraints, Learning
from apps.policies.spec.fields import (
    _ERROR_TYPE,
    FieldError,
    SpecError,
    _f,
    _item_model,
    _join,
    _Spec,
    _sub,
    _type_name,
    is_section,
)
from apps.policies.spec.guardrails import Guardrails, ToolsPolicy, _stage_problems


class PolicySpec(_Spec):
    constraints: Constraints = _f(
        Constraints, "Workflow constraints, checked at plan time and before every step.", "nested"
    )
    budgets: Budgets = _f(Budgets, "Team spend limits.", "nested")
    learning: Learning = _f(Learning, "The learned router: exploration, reward and metric.", "nested")
    guardrails: Guardrails = _f(Guardrails, "Guardrails per stage.", "nested")
    tools: ToolsPolicy = _f(
        ToolsPolicy, "Governed tools (MCP): which tools, with what arguments, how often.", "nested"
    )


def _loc_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for key in loc:
        path = _join(path, key)
    return path


def _model_at(loc: tuple[int | str, ...]) -> type[BaseModel]:
    """The section class at a pydantic error location (to list its known fields)."""
    cls: type[BaseModel] = PolicySpec
    for key in loc:
        f = cls.model_fields.get(key) if isinstance(key, str) else None
        tp = f.annotation if f is not None else None
        if is_section(tp):
            cls = tp
        elif f is not None:
            cls = _item_model(tp) or cls
    return cls


def _field_errors(exc: ValidationError) -> list[FieldError]:
    """pydantic's errors in this module's format: the dotted field path and what is wrong."""
    errors: list[FieldError] = []
    for e in exc.errors(include_url=False):
        loc, kind, ctx = e["loc"], e["type"], e.get("ctx") or {}
        path = _loc_path(loc)
        if kind == _ERROR_TYPE:
            errors.extend(FieldError(_sub(path, sub), message) for sub, message in ctx["problems"])
        elif kind == "extra_forbidden":
            known = ", ".join(_model_at(loc[:-1]).model_fields)
            where = _join(_loc_path(loc[:-1]), str(loc[-1])[:100])
            errors.append(FieldError(where, f"unknown field (known: {known})"))
        elif kind == "missing":
            errors.append(FieldError(path, "is required"))
        elif kind in ("model_type", "model_attributes_type", "dict_type"):
            errors.append(FieldError(path, f"must be an object, got {_type_name(e['input'])}"))
        else:  # pragma: no cover — every leaf is checked by this module
            errors.append(FieldError(path, e["msg"]))
    return errors


def validate_spec(data: Any) -> tuple[PolicySpec | None, list[FieldError]]:
    """Validate raw JSON data; return (spec, []) or (None, every error with its field path)."""
    try:
        spec = PolicySpec.model_validate(data)
    except ValidationError as exc:
        errors = _field_errors(exc)
        # A section with a bad field skips its cross-field rules; the stage rule reads raw data.
        guardrails = data.get("guardrails") if isinstance(data, Mapping) else None
        for sub, message in _stage_problems(guardrails):
            path = _join("guardrails", sub)
            if not any(e.path == path for e in errors):
                errors.append(FieldError(path, message))
        return None, errors
    return spec, []


def parse_spec(data: Any) -> PolicySpec:
    """Like `validate_spec` but raises `SpecError` listing every error."""
    spec, errors = validate_spec(data)
    if errors or spec is None:
        raise SpecError(errors)
    return spec


@cache
def policy_json_schema() -> dict[str, Any]:
    """The spec's JSON Schema (help text, merge rules and bounds included): the editor's source."""
    return PolicySpec.model_json_schema()


# ------------------------------------------------------------------------------------ serialisation


def spec_to_dict(obj: Any) -> Any:
    """JSON-safe dict of a spec (Decimals as strings, tuples as lists)."""
    if isinstance(obj, BaseModel):
        return {name: spec_to_dict(getattr(obj, name)) for name in type(obj).model_fields}
    if isinstance(obj, tuple | list):
        return [spec_to_dict(v) for v in obj]
    if isinstance(obj, Decimal):
        return str(obj)
    return obj


def default_spec() -> PolicySpec:
    return PolicySpec()
