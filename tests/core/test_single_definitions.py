"""One definition per idea (issue 41 item 1): the refused characters live in one place, and the
sink's event handlers are registered explicitly rather than found by building a method name."""

from __future__ import annotations

import inspect
from pathlib import Path

from apps.engine.events import EventType
from apps.engine.text import BAD_CHARS, has_bad_chars
from apps.runs.sink import RunSink

ROOT = Path(__file__).resolve().parents[2]


def test_the_refused_characters_are_defined_once() -> None:
    literal = BAD_CHARS.pattern.encode("unicode_escape").decode()  # as it is written in source
    defined = sorted(
        path.relative_to(ROOT).as_posix()
        for package in ("apps", "conductor_web")
        for path in (ROOT / package).rglob("*.py")
        if literal in path.read_text(encoding="utf-8")
        or BAD_CHARS.pattern in path.read_text(encoding="utf-8")
    )
    assert defined == ["apps/engine/text.py"]
    assert has_bad_chars("a\x00b") and has_bad_chars("\ud800") and not has_bad_chars("plain \U0001f600")


def test_every_sink_handler_is_registered_for_its_event_type() -> None:
    handlers = {
        name for name, _ in inspect.getmembers(RunSink, inspect.isfunction) if name.startswith("_on_")
    }
    registered = {fn.__name__ for fn in RunSink._HANDLERS.values()}
    assert registered == handlers, "an _on_* method no event reaches, or a registered one that is gone"
    for event_type, fn in RunSink._HANDLERS.items():
        assert event_type in set(EventType), event_type
        assert fn.__name__ == "_on_" + event_type.replace(".", "_"), (event_type, fn.__name__)


def test_no_handler_is_looked_up_by_a_built_name() -> None:
    built = [
        path.relative_to(ROOT).as_posix()
        for package in ("apps", "conductor_web")
        for path in (ROOT / package).rglob("*.py")
        if '"_on_" +' in path.read_text(encoding="utf-8") or 'f"_on_{' in path.read_text(encoding="utf-8")
    ]
    assert built == []
