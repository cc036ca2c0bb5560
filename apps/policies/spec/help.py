"""Help text for every spec field, read from the one declaration (descriptions, merge rules)."""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal, get_args, get_origin

from pydantic import (
    BaseModel,
)

from apps.policies.spec.fields import _item_model, _join, _meta, is_section
from apps.policies.spec.policy import PolicySpec, spec_to_dict

# ------------------------------------------------------------------------------------ help


MERGE_RULE_TEXT = {
    "min": "team may only lower it (smaller limit wins)",
    "stricter": "the stricter of platform and team wins",
    "or": "on if the platform or the team turns it on",
    "union": "platform and team entries both apply",
    "intersection": "only what both platform and team allow",
    "all_of": "both the platform's and the team's apply",
    "platform": "the platform's value wins when it sets one",
}


@dataclass(frozen=True, slots=True)
class FieldHelp:
    path: str
    help: str
    merge: str
    rule_text: str
    type_text: str
    default: Any


def _type_text(tp: Any) -> str:
    origin, args = get_origin(tp), get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _type_text(inner[0]) + " or empty"
    if origin is Literal:
        return " | ".join(map(str, args))
    if origin is tuple:
        return f"list of {_type_text(args[0])}"
    if is_section(tp):
        return "object"
    return {bool: "true/false", int: "whole number", float: "number", Decimal: "USD amount", str: "text"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def iter_field_help(cls: type[BaseModel] | None = None, prefix: str = "") -> Iterator[FieldHelp]:
    """Every field of the spec with its help text and merge rule, in declaration order."""
    for name, f in (cls or PolicySpec).model_fields.items():
        path = _join(prefix, name)
        tp, merge, help_text = f.annotation, _meta(f)["merge"], f.description or ""
        if merge == "nested":
            yield FieldHelp(path, help_text, merge, "", "section", None)
            yield from iter_field_help(tp, path)  # type: ignore[arg-type]
            continue
        default = "" if f.is_required() else f.get_default(call_default_factory=True)
        yield FieldHelp(path, help_text, merge, MERGE_RULE_TEXT[merge], _type_text(tp), spec_to_dict(default))
        item = _item_model(tp)
        if item is not None:
            yield from iter_field_help(item, path + "[]")


def field_help_map() -> dict[str, FieldHelp]:
    return {h.path: h for h in iter_field_help()}
