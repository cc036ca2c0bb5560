"""Engine tests run without Django (`pytest tests/engine -p no:django`)."""

from __future__ import annotations

import sys
from pathlib import Path

# `apps` and `tests` are imported from the repository root; make that work however pytest is run.
_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from tests.fakes.fixtures import anthropic_fake, openai_fake  # noqa: E402, F401
