"""The structured policy editor, generated from the spec's own declaration (`apps.policies.spec`).

Pure Python (no Django): the sections and inputs come from the spec models' JSON schema
(`PolicySpec.model_json_schema()`: descriptions are the help text, `merge` the merge rule, plus
bounds and choices), so the form can never offer a field the
validator does not know, nor miss one it does. The form posts one input per leaf, named
``f-<path>``; `form_to_spec` turns the post back into spec JSON, which `validate_spec` then checks
like any JSON the advanced mode submits.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from apps.policies.spec import MERGE_RULE_TEXT, FieldError, _join, policy_json_schema, spec_to_dict

PREFIX = "f-"

# How one leaf is edited. lines: one entry per line; multi: a checkbox per allowed value;
# json: a JSON value (lists of objects, the output schema) edited as text.
Kind = Literal["bool", "choice", "int", "float", "decimal", "text", "lines", "multi", "json"]


@dataclass(frozen=True, slots=True)
class EditorField:
    path: str
    label: str
    kind: Kind
    help: str
    merge: str
    nullable: bool = False
    choices: tuple[str, ...] = ()
    minimum: Any = None
    maximum: Any = None

    @property
    def name(self) -> str:
        return PREFIX + self.path

    @property
    def input_id(self) -> str:
        return "pe-" + self.path.replace(".", "-")

    @property
    def rule_text(self) -> str:
        return MERGE_RULE_TEXT.get(self.merge, "")


@dataclass(slots=True)
class EditorSection:
    path: str
    label: str
    help: str
    fields: list[EditorField] = field(default_factory=list)
    sections: list[EditorSection] = field(default_factory=list)


def _label(name: str) -> str:
    return name.replace("_", " ").capitalize()


def _resolve(schema: Mapping[str, Any], defs: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = schema.get("$ref")
    return defs[ref.rsplit("/", 1)[-1]] if isinstance(ref, str) else schema


def _leaf(path: str, name: str, prop: Mapping[str, Any]) -> EditorField:
    """One input from a property of the spec's JSON schema (description = help, `merge`, bounds)."""
    options = prop.get("anyOf")
    nullable = False
    tp: Mapping[str, Any] = prop
    if options is not None:
        typed = [o for o in options if o.get("type") != "null"]
        nullable = len(typed) < len(options)
        # An amount (Decimal) is written as a number or a string: its own kind.
        types_ = {o.get("type") for o in typed}
        tp = {"type": "decimal"} if types_ == {"number", "string"} else typed[0]
    kind: Kind
    choices: tuple[str, ...] = ()
    items = tp.get("items") or {}
    if "enum" in tp:
        kind, choices = "choice", tuple(str(a) for a in tp["enum"] if a not in prop.get("exclude", ()))
    elif tp.get("type") == "array" and items.get("type") == "string" and "enum" not in items:
        kind = "multi" if prop.get("choices") else "lines"
        choices = tuple(prop.get("choices") or ())
    else:  # lists of objects (rules, terms, judges) and of fixed labels, and the JSON schema
        kind = _KINDS.get(tp.get("type"), "json")
    return EditorField(
        path=path,
        label=_label(name),
        kind=kind,
        help=prop.get("description", ""),
        merge=prop["merge"],
        nullable=nullable,
        choices=choices,
        minimum=prop.get("minimum"),
        maximum=prop.get("maximum"),
    )


_KINDS: dict[Any, Kind] = {
    "boolean": "bool",
    "integer": "int",
    "number": "float",
    "decimal": "decimal",
    "string": "text",
}


def build_sections(schema: Mapping[str, Any] | None = None) -> EditorSection:
    """The editor's tree of sections and leaf inputs, in declaration order, generated from the
    spec's JSON schema (`PolicySpec.model_json_schema()`, or the one given)."""
    root = schema if schema is not None else policy_json_schema()
    return _section(root, root.get("$defs", {}), "", "Policy", "")


def _section(
    node: Mapping[str, Any], defs: Mapping[str, Any], prefix: str, label: str, help: str
) -> EditorSection:
    section = EditorSection(prefix, label, help)
    for name, prop in _resolve(node, defs)["properties"].items():
        path = _join(prefix, name)
        if prop.get("merge") == "nested":
            section.sections.append(_section(prop, defs, path, _label(name), prop.get("description", "")))
        else:
            section.fields.append(_leaf(path, name, prop))
    return section


def iter_fields(section: EditorSection) -> typing.Iterator[EditorField]:
    yield from section.fields
    for sub in section.sections:
        yield from iter_fields(sub)


def get_path(data: Any, path: str) -> Any:
    """The value at a dotted path of a spec dict (None when absent)."""
    for key in path.split("."):
        if not isinstance(data, Mapping):
            return None
        data = data.get(key)
    return data


def _set_path(data: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for key in parents:
        data = data.setdefault(key, {})
    data[last] = value


# ------------------------------------------------------------------------------------ display


def display_value(f: EditorField, value: Any) -> Any:
    """What the input shows for a spec value (spec_to_dict form)."""
    if f.kind == "bool":
        return bool(value)
    if f.kind == "multi":
        return list(value or ())
    if f.kind == "lines":
        return "\n".join(str(v) for v in value or ())
    if f.kind == "json":
        return "" if value in (None, [], ()) else json.dumps(value, indent=2)
    return "" if value is None else str(value)


def short_value(value: Any) -> str:
    """One-line text of a spec value, for the platform column and the diff."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list | tuple):
        return ", ".join(str(v) if not isinstance(v, dict | list) else json.dumps(v) for v in value) or "none"
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value)


# ------------------------------------------------------------------------------------ post → spec


def _raw(post: Mapping[str, Any], name: str) -> str:
    value = post.get(name, "")
    return value if isinstance(value, str) else str(value)


def form_to_spec(post: Any, root: EditorSection | None = None) -> tuple[dict[str, Any], list[FieldError]]:
    """Spec JSON from a form post (a QueryDict or a mapping of lists), plus the input errors the
    spec validator cannot name (a number that is not a number, JSON that does not parse)."""
    root = root or build_sections()
    getlist = post.getlist if hasattr(post, "getlist") else (lambda k: list(post.get(k) or ()))
    spec: dict[str, Any] = {}
    errors: list[FieldError] = []
    for f in iter_fields(root):
        raw = _raw(post, f.name).strip() if f.kind not in ("bool", "multi") else ""
        value: Any
        if f.kind == "bool":
            value = post.get(f.name) in ("on", "true", "1")
        elif f.kind == "multi":
            value = [v for v in getlist(f.name) if v]
        elif f.kind == "lines":
            items = [line.strip() for line in raw.splitlines() if line.strip()]
            value = None if (f.nullable and not items) else items
        elif f.kind == "json":
            if not raw:
                value = None if f.nullable else []
            else:
                try:
                    value = json.loads(raw)
                except json.JSONDecodeError as err:
                    errors.append(FieldError(f.path, f"not valid JSON: {err.msg} (line {err.lineno})"))
                    continue
        elif f.kind in ("int", "float"):
            if not raw:
                value = None
            else:
                try:
                    value = int(raw) if f.kind == "int" else float(raw)
                except ValueError:
                    what = "a whole number" if f.kind == "int" else "a number"
                    errors.append(FieldError(f.path, f"must be {what}, got {raw[:40]!r}"))
                    continue
        elif f.kind == "decimal":
            value = raw or None  # the validator parses amounts (and names the field when it cannot)
        else:
            value = _raw(post, f.name)  # text and choices: kept as typed; the validator checks them
        _set_path(spec, f.path, value)
    return spec, errors


# ------------------------------------------------------------------------------------ bound tree


@dataclass(slots=True)
class BoundField:
    field: EditorField
    value: Any
    platform: str | None  # the platform value this field tightens (team policies only)
    changed: bool  # differs from the published version
    errors: list[str]


@dataclass(slots=True)
class BoundSection:
    section: EditorSection
    fields: list[BoundField]
    sections: list[BoundSection]
    open: bool  # rendered expanded: it holds a change or an error
    changes: int
    error_count: int

    @property
    def path(self) -> str:
        return self.section.path


def bind(
    root: EditorSection,
    *,
    values: Mapping[str, Any] | None,
    spec: Mapping[str, Any],
    published: Mapping[str, Any],
    platform: Mapping[str, Any] | None,
    errors: list[FieldError],
) -> BoundSection:
    """Attach values to the tree. ``values`` are raw posted inputs (re-shown after an error);
    otherwise ``spec`` (a normalised spec dict) is displayed."""
    by_path: dict[str, list[str]] = {}
    for e in errors:
        # An error inside a list entry (terms[0].pattern) belongs to the list's input.
        key = e.path.split("[", 1)[0]
        by_path.setdefault(key, []).append(e.message if key == e.path else f"{e.path}: {e.message}")

    def walk(section: EditorSection) -> BoundSection:
        fields = []
        for f in section.fields:
            current = get_path(spec, f.path)
            if values is not None:
                shown = values.getlist(f.name) if f.kind == "multi" and hasattr(values, "getlist") else None
                value = (
                    shown
                    if shown is not None
                    else (
                        values.get(f.name) in ("on", "true", "1")
                        if f.kind == "bool"
                        else values.get(f.name, "")
                    )
                )
            else:
                value = display_value(f, current)
            fields.append(
                BoundField(
                    f,
                    value,
                    short_value(get_path(platform, f.path)) if platform is not None else None,
                    current != get_path(published, f.path),
                    by_path.get(f.path, []),
                )
            )
        subs = [walk(s) for s in section.sections]
        changes = sum(b.changed for b in fields) + sum(s.changes for s in subs)
        errs = sum(bool(b.errors) for b in fields) + sum(s.error_count for s in subs)
        return BoundSection(section, fields, subs, bool(changes or errs), changes, errs)

    return walk(root)


def normalised(spec: Any) -> dict[str, Any]:
    """spec_to_dict of a parsed spec, or {} for None."""
    return spec_to_dict(spec) if spec is not None else {}
