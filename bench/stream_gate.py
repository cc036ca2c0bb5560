"""The incremental output gate's cost per streamed chunk (issue 45). Not a test: prints one line.

    .venv/bin/python bench/stream_gate.py

A 4.5 KB answer fed in 4-character chunks (about one token each) through a gate with PII,
secrets (redact) and one blocked term (block): total time and time per chunk, and the same
answer checked once whole by ``run_stage`` for comparison.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from apps.policies.guardrails import run_stage
from apps.policies.guardrails.stream import StreamGate
from apps.policies.spec import parse_spec

CHECKS = parse_spec(
    {
        "guardrails": {
            "output": {
                "pii": {"enabled": True, "action": "redact"},
                "secrets": {"enabled": True, "action": "redact"},
                "blocked_terms": {
                    "enabled": True,
                    "action": "block",
                    "terms": [{"pattern": "insider trading"}],
                },
            }
        }
    }
).guardrails.output
TEXT = "The quick brown fox jumps over the lazy dog while the market opens at nine. " * 60


def main() -> None:
    best = float("inf")
    for _ in range(5):
        gate = StreamGate(CHECKS)
        t0 = time.perf_counter()
        chunks = 0
        for i in range(0, len(TEXT), 4):
            gate.feed(TEXT[i : i + 4])
            chunks += 1
        gate.close()
        best = min(best, time.perf_counter() - t0)
    t0 = time.perf_counter()
    run_stage("output", CHECKS, TEXT)
    whole = time.perf_counter() - t0
    print(
        f"{len(TEXT)} chars in {chunks} chunks: {best * 1000:.1f} ms streamed ({best / chunks * 1e6:.0f} us/chunk), "
        f"{whole * 1000:.1f} ms checked whole"
    )


if __name__ == "__main__":
    main()
