"""make test ends with each phase's failures, so CI's tail names them (scripts/junit_summary.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

REPORT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="3" failures="1" errors="1">
<testcase classname="tests.runs.test_x" name="test_ok" time="0.1"/>
<testcase classname="tests.runs.test_x" name="test_bad" time="0.1">
<failure message="AssertionError: 2 calls, expected 1">trace</failure></testcase>
<testcase classname="tests.api.test_y" name="test_setup" time="0.1">
<error message="fixture 'live' failed">trace</error></testcase>
</testsuite></testsuites>"""


def test_summary_names_failures_per_phase_and_missing_reports(tmp_path: Path) -> None:
    (tmp_path / "distributed.xml").write_text(REPORT)
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts/junit_summary.py"),
            str(tmp_path / "distributed.xml"),
            str(tmp_path / "embedded.xml"),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "distributed: 3 tests, 2 failed or errored" in out
    assert "FAILURE tests.runs.test_x::test_bad: AssertionError: 2 calls, expected 1" in out
    assert "ERROR tests.api.test_y::test_setup: fixture 'live' failed" in out
    assert "test_ok" not in out
    assert "embedded: no report" in out
