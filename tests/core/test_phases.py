"""The phase rule (tests/phases.py): what makes a test runtime, so the distributed phase keeps it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from tests.phases import PHASES, ROOT, runtime_reason, selected, vendor_modules


class FakeItem:
    """The parts of a pytest item the rule reads."""

    def __init__(
        self,
        path: str,
        *,
        marks: dict[str, dict[str, Any]] | None = None,
        fixtures: tuple[str, ...] = (),
        function: Callable[..., Any] | None = None,
    ) -> None:
        self.path = ROOT / path
        self.marks = marks or {}
        self.fixturenames = list(fixtures)
        self.function = function or (lambda: None)

    def get_closest_marker(self, name: str) -> pytest.Mark | None:
        return getattr(pytest.mark, name)(**self.marks[name]).mark if name in self.marks else None


def Item(path: str, **parts: Any) -> pytest.Item:
    return cast(pytest.Item, FakeItem(path, **parts))


def test_vendor_modules_are_found_by_reading_the_code() -> None:
    found = vendor_modules()
    # A vendor branch, an advisory lock, LISTEN/NOTIFY, prepared statements, SKIP LOCKED:
    for module in (
        "apps.audit.sequencer",
        "apps.runs.end_listener",
        "apps.core.compiled",
        "apps.insights.upsert",
    ):
        assert module in found
    assert not any(m.startswith("apps.engine") for m in found)  # no SQL below Django


def test_explicit_marks_and_runtime_fixtures_are_runtime() -> None:
    plain = "tests/engine/test_plan.py"
    assert runtime_reason(Item(plain)) is None
    assert runtime_reason(Item(plain, marks={"browser": {}})) == "mark:browser"
    assert runtime_reason(Item(plain, fixtures=("daphne_server",))) == "fixture:daphne_server"
    assert (
        runtime_reason(Item(plain, marks={"django_db": {"transaction": True}})) == "fixture:transactional_db"
    )
    assert runtime_reason(Item("tests/faults/test_fuzz.py")) == "dir:tests/faults/"

    async def coroutine() -> None:
        return None

    assert runtime_reason(Item(plain, function=coroutine)) == "async"


def test_database_tests_of_vendor_specific_code_are_runtime() -> None:
    # Each of these modules is about SQL that differs by vendor, and none is marked by hand.
    for path in (
        "tests/core/test_compiled.py",
        "tests/audit/test_sequencer.py",
        "tests/insights/test_upsert.py",
    ):
        assert not Path(ROOT / path).read_text().count("pytest.mark.runtime")
        reason = runtime_reason(Item(path, marks={"django_db": {}}))
        assert reason is not None and reason.startswith(("db+", "names:")), (path, reason)
    # A module that only uses portable ORM code runs once.
    assert runtime_reason(Item("tests/policies/test_guardrails.py")) is None


def test_the_distributed_phase_skips_slow_and_portable_tests_and_the_embedded_runs_all() -> None:
    portable = Item("tests/engine/test_plan.py")
    runtime = Item("tests/engine/test_plan.py", marks={"runtime": {}})
    slow_runtime = Item("tests/engine/test_plan.py", marks={"runtime": {}, "slow": {}})
    distributed, embedded = PHASES["distributed"], PHASES["embedded"]
    assert [selected(i, distributed) for i in (portable, runtime, slow_runtime)] == [False, True, False]
    assert [selected(i, embedded) for i in (portable, runtime, slow_runtime)] == [True, True, True]
