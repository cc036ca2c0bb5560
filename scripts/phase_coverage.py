"""Proves that every collected test runs in at least one phase of ``make test``.

    .venv/bin/python scripts/phase_coverage.py [-v] [pytest args...]

Collects the suite once (embedded mode, no services needed), applies each phase's selection from
tests/phases.py — the one tests/conftest.py applies when scripts/test.sh sets CONDUCTOR_PHASE — and
exits 1 naming any test no phase runs. Prints the count per phase and why tests are runtime;
``-v`` lists every test with its phases and reason.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.phases import PHASES, runtime_reason, selected  # noqa: E402


class Recorder:
    def __init__(self) -> None:
        self.items: list[pytest.Item] = []

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        self.items = list(items)


def main(argv: list[str]) -> int:
    verbose = "-v" in argv
    args = [a for a in argv if a != "-v"]
    os.chdir(ROOT)
    for var in (
        "DATABASE_URL",
        "REDIS_URL",
        "CELERY_BROKER_URL",
        "CONDUCTOR_PHASE",
        "CONDUCTOR_ONLY_RUNTIME",
    ):
        os.environ.pop(var, None)
    os.environ.pop("CONDUCTOR_SLOW", None)  # collect the local-model tests too
    recorder = Recorder()
    listing = io.StringIO()
    with contextlib.redirect_stdout(listing):
        code = pytest.main(["--collect-only", "-q", *args], plugins=[recorder])
    if code not in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        print(
            listing.getvalue()[-3000:],
            f"phase_coverage: collection failed (exit {int(code)})",
            file=sys.stderr,
        )
        return int(code)
    items = recorder.items
    runs = {item.nodeid: [name for name, phase in PHASES.items() if selected(item, phase)] for item in items}
    reasons = {item.nodeid: runtime_reason(item) for item in items}
    if verbose:
        for nodeid, phases in runs.items():
            print(f"{','.join(phases) or 'NONE':24} {reasons[nodeid] or 'once':36} {nodeid}")
    print(f"collected: {len(items)}")
    for name in PHASES:
        print(f"phase {name}: {sum(name in phases for phases in runs.values())} tests")
    print(f"runtime (both phases where not slow): {sum(r is not None for r in reasons.values())}")
    kinds = Counter((reason or "once (embedded phase only)").split(":")[0] for reason in reasons.values())
    for kind, count in kinds.most_common():
        print(f"  {count:5} {kind}")
    dropped = [nodeid for nodeid, phases in runs.items() if not phases]
    if dropped:
        print(f"phase_coverage: {len(dropped)} collected tests run in no phase:", file=sys.stderr)
        for nodeid in dropped:
            print(f"  {nodeid}", file=sys.stderr)
        return 1
    print("phase_coverage: every collected test runs in at least one phase")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
