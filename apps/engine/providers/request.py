"""A provider request as one value, and every text-bearing field in it (issue 39).

``ProviderRequest`` is what any caller asks of a model provider: chat messages, the JSON schema of
a structured answer, the API client's generation options (``apps.engine.generation``), or the
texts of an embeddings request (``inputs``: each its own field ``input[i]``, read apart). The
outbound gate (``apps.engine.providers.gate``) reads it with ``text_fields`` and writes the
policy's redactions back with ``rewritten``; the providers turn only the admitted value into
their wire format (adding nothing but their own constants: model, token limit, the forced tool
that carries a JSON schema on Anthropic).

Paths name fields as the client would (``messages[2].name``, ``tools[0].function.description``);
inside a JSON value, object members are named by position (``parameters[#0][#1]``), never by
their keys, which are user text too. The reader knows the shape of every field it accepts. Anything else (a key it does not know, a
value that is not text where text belongs, bytes) raises ``UnreadableField`` naming the field: a
field the gate cannot read is refused, never passed on unchecked.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from apps.engine.checks import OutboundField
from apps.engine.generation import GenerationOptions, ResponseFormat
from apps.engine.types import Message

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
MESSAGE_KEYS = frozenset({"role", "content", "name", "tool_calls", "tool_call_id"})
TOOL_CALL_KEYS = frozenset({"id", "type", "function"})
CALL_FUNCTION_KEYS = frozenset({"name", "arguments"})
TOOL_KEYS = frozenset({"type", "function"})
TOOL_FUNCTION_KEYS = frozenset({"name", "description", "parameters", "strict"})
TOOL_CHOICE_WORDS = frozenset({"auto", "none", "required"})
MAX_JSON_DEPTH = 64

# Where a field sits: ("messages", 2, "name"), or for a JSON object's key ("json_schema", "x", KEY).
Locator = tuple[Any, ...]
KEY = object()  # marks a locator that names a JSON object's key rather than its value


class UnreadableField(Exception):
    """A field the gate cannot read; ``path`` names it, ``why`` says what is wrong."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.path = path
        self.why = why


@dataclass(frozen=True, slots=True)
class ProviderRequest:
    messages: tuple[Message, ...]
    json_schema: dict[str, Any] | None = None
    options: GenerationOptions | None = None
    # An embeddings request's texts (``/v1/embeddings``): independent documents, not turns.
    inputs: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class _Found:
    field: OutboundField
    where: Locator


def text_fields(request: ProviderRequest) -> list[OutboundField]:
    return [f.field for f in _walk(request)]


def _walk(request: ProviderRequest) -> list[_Found]:
    out: list[_Found] = []
    for i, message in enumerate(request.messages):
        _message(out, i, message)
    if request.json_schema is not None:
        _json(out, "json_schema", request.json_schema, ("json_schema",), 0)
    if request.options is not None:
        _options(out, request.options)
    for j, text in enumerate(request.inputs):
        _text(out, f"input[{j}]", text, ("inputs", j))
    return out


def _text(out: list[_Found], path: str, value: Any, where: Locator, *, message: int | None = None) -> None:
    if not isinstance(value, str):
        raise UnreadableField(path, f"expected text, found {type(value).__name__}")
    if value:
        out.append(_Found(OutboundField(path, value, message), where))


def _known_keys(path: str, value: Any, keys: frozenset[str]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise UnreadableField(path, f"expected an object, found {type(value).__name__}")
    for key in value:
        if key not in keys:
            raise UnreadableField(f"{path}.{key}", "not a field the outbound gate knows")
    return value


def _message(out: list[_Found], i: int, message: Any) -> None:
    path = f"messages[{i}]"
    m = _known_keys(path, message, MESSAGE_KEYS)
    if m.get("role") not in ROLES:
        raise UnreadableField(f"{path}.role", "not a known role")
    content = m.get("content")
    if content is not None:
        _text(out, f"{path}.content", content, ("messages", i, "content"), message=i)
    for key in ("name", "tool_call_id"):
        if m.get(key) is not None:
            _text(out, f"{path}.{key}", m[key], ("messages", i, key))
    calls = m.get("tool_calls")
    if calls is None:
        return
    if not isinstance(calls, Sequence) or isinstance(calls, str):
        raise UnreadableField(f"{path}.tool_calls", "expected a list")
    for j, call in enumerate(calls):
        cpath = f"{path}.tool_calls[{j}]"
        c = _known_keys(cpath, call, TOOL_CALL_KEYS)
        if c.get("type", "function") != "function":
            raise UnreadableField(f"{cpath}.type", "only function calls can be read")
        if c.get("id") is not None:
            _text(out, f"{cpath}.id", c["id"], ("messages", i, "tool_calls", j, "id"))
        fn = _known_keys(f"{cpath}.function", c.get("function") or {}, CALL_FUNCTION_KEYS)
        for key in ("name", "arguments"):
            if fn.get(key) is not None:
                _text(
                    out, f"{cpath}.function.{key}", fn[key], ("messages", i, "tool_calls", j, "function", key)
                )


def _json(out: list[_Found], path: str, value: Any, where: Locator, depth: int) -> None:
    """Every key and string of a JSON value (a schema's descriptions, titles, enums, names)."""
    if depth > MAX_JSON_DEPTH:
        raise UnreadableField(path, f"nested deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(value, str):
        _text(out, path, value, where)
    elif isinstance(value, Mapping):
        # Members by position, not by name: a key is user text too, and paths are recorded.
        for n, (key, item) in enumerate(value.items()):
            if not isinstance(key, str):
                raise UnreadableField(path, "an object key that is not text")
            _text(out, f"{path}[#{n} key]", key, (*where, key, KEY))
            _json(out, f"{path}[#{n}]", item, (*where, key), depth + 1)
    elif isinstance(value, (list, tuple)):
        for j, item in enumerate(value):
            _json(out, f"{path}[{j}]", item, (*where, j), depth + 1)
    elif value is not None and not isinstance(value, (bool, int, float)):
        raise UnreadableField(path, f"{type(value).__name__} is not JSON")


def _options(out: list[_Found], options: GenerationOptions) -> None:
    for j, stop in enumerate(options.stop):
        _text(out, f"stop[{j}]", stop, ("stop", j))
    fmt = options.response_format
    if fmt is not None:
        _text(out, "response_format.name", fmt.name, ("response_format", "name"))
        if fmt.schema is not None:
            _json(out, "response_format.schema", fmt.schema, ("response_format", "schema"), 0)
    for j, tool in enumerate(options.tools):
        tpath = f"tools[{j}]"
        t = _known_keys(tpath, tool, TOOL_KEYS)
        if t.get("type") != "function":
            raise UnreadableField(f"{tpath}.type", "only function tools can be read")
        fn = _known_keys(f"{tpath}.function", t.get("function"), TOOL_FUNCTION_KEYS)
        for key in ("name", "description"):
            if fn.get(key) is not None:
                _text(out, f"{tpath}.function.{key}", fn[key], ("tools", j, "function", key))
        if fn.get("parameters") is not None:
            _json(
                out,
                f"{tpath}.function.parameters",
                fn["parameters"],
                ("tools", j, "function", "parameters"),
                0,
            )
        if fn.get("strict") is not None and not isinstance(fn["strict"], bool):
            raise UnreadableField(f"{tpath}.function.strict", "expected true or false")
    choice = options.tool_choice
    if choice is None or choice in TOOL_CHOICE_WORDS:
        return
    c = _known_keys("tool_choice", choice, TOOL_KEYS)
    fn = _known_keys("tool_choice.function", c.get("function"), frozenset({"name"}))
    _text(out, "tool_choice.function.name", fn.get("name"), ("tool_choice", "function", "name"))


def rewritten(request: ProviderRequest, texts: Mapping[str, str]) -> ProviderRequest:
    """``request`` with the fields named in ``texts`` replaced (copies: the caller's values and
    the run's records keep what they hold)."""
    if not texts:
        return request
    found = [f for f in _walk(request) if f.field.path in texts]
    if not found:
        return request
    tree: dict[str, Any] = {
        "messages": [dict(m) for m in request.messages],
        "json_schema": copy.deepcopy(request.json_schema),
        "inputs": list(request.inputs),
    }
    options = request.options
    if options is not None:
        tree["stop"] = list(options.stop)
        tree["tools"] = copy.deepcopy([dict(t) for t in options.tools])
        tree["tool_choice"] = copy.deepcopy(options.tool_choice)
        fmt = options.response_format
        tree["response_format"] = (
            {"name": fmt.name, "schema": copy.deepcopy(fmt.schema)} if fmt is not None else None
        )
    # Values first, then keys deepest first: every locator still names the keys as they were.
    found.sort(key=lambda f: (f.where[-1] is KEY, -len(f.where)))
    for item in found:
        _put(tree, item.where, texts[item.field.path])
    if options is not None:
        fmt = options.response_format
        options = replace(
            options,
            stop=tuple(tree["stop"]),
            tools=tuple(tree["tools"]),
            tool_choice=tree["tool_choice"],
            response_format=(
                ResponseFormat(
                    fmt.type, tree["response_format"]["schema"], tree["response_format"]["name"], fmt.strict
                )
                if fmt is not None
                else None
            ),
        )
    return ProviderRequest(tuple(tree["messages"]), tree["json_schema"], options, tuple(tree["inputs"]))


def _put(tree: dict[str, Any], where: Locator, text: str) -> None:
    if where[-1] is KEY:
        parent = _get_copy(tree, where[:-2])
        old = where[-2]
        # Rebuilt in order: the renamed key keeps its place (the schema reads the same).
        items = [(text if k == old else k, v) for k, v in parent.items()]
        parent.clear()
        parent.update(items)
        return
    parent = _get_copy(tree, where[:-1])
    parent[where[-1]] = text


def _get_copy(tree: dict[str, Any], where: Locator) -> Any:
    """The container at ``where``, copying shared message and tool-call levels on the way."""
    node: Any = tree
    for step in where:
        child = node[step]
        if isinstance(child, dict):
            child = dict(child)
        elif isinstance(child, (list, tuple)):
            child = list(child)
        node[step] = child
        node = child
    return node
