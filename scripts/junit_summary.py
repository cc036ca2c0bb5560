"""Prints the failed and errored tests of each phase's JUnit XML, last in ``make test``'s output.

    python scripts/junit_summary.py var/test-reports/distributed.xml var/test-reports/embedded.xml

CI keeps only the tail of a long log; the phase that failed first would otherwise scroll out of it.
Uses only the standard library so it runs even when the venv is broken.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def failures(path: Path) -> tuple[int, list[str]]:
    """(tests counted, lines naming each failed or errored test with the first line of why)."""
    root = ET.parse(path).getroot()  # noqa: S314 — pytest wrote it in this run, not untrusted
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    total = sum(int(s.get("tests", 0)) for s in suites)
    lines: list[str] = []
    for case in root.iter("testcase"):
        for kind in ("failure", "error"):
            node = case.find(kind)
            if node is None:
                continue
            why = (node.get("message") or node.text or "").strip().splitlines()
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            lines.append(f"  {kind.upper()} {name}: {why[0][:300] if why else ''}")
    return total, lines


def main(argv: list[str]) -> int:
    for arg in argv:
        path = Path(arg)
        if not path.exists():
            print(f"{path.stem}: no report (phase skipped or did not start)")
            continue
        try:
            total, lines = failures(path)
        except ET.ParseError as exc:
            print(f"{path.stem}: unreadable report ({exc})")
            continue
        print(f"{path.stem}: {total} tests, {len(lines)} failed or errored")
        for line in lines:
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
