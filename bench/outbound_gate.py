"""Cost of the outbound gate per provider request (issue 39): pure Python, no database, no model.

    .venv/bin/python bench/outbound_gate.py [--repeat N]

Every provider call passes ``OutboundGate.admit`` before its socket opens, so this is on the hot
path of every worker step, planning call and judge. Measured per request, median and p95 in µs:

- ``read only``: the gate with no policy (it still reads every field and would refuse an
  unreadable one): the floor every call pays;
- ``policy, cold``: the team's input detectors (pii, secrets, injection, blocked_terms), each text
  seen for the first time;
- ``policy, warm``: the same request again (a run sends the question to every step: each text is
  scanned once per run, ``apps.policies.outbound.CACHE_ENTRIES``);

on a worker step (question + one earlier step + instruction, ~1 KB), a ``/v1`` tool conversation
(10 messages, 3 tools with JSON schemas, stop, ~3 KB), and a 100 KB message; ASCII and with a few
non-ASCII characters (the canonical form then maps every character).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "conductor_web.settings.test")

import django

django.setup()

from apps.engine.generation import GenerationOptions  # noqa: E402
from apps.engine.providers.gate import OutboundGate, gate_without_policy  # noqa: E402
from apps.policies.outbound import OutboundChecks  # noqa: E402
from apps.policies.spec import parse_spec  # noqa: E402

POLICY = {
    "guardrails": {
        "input": {
            "pii": {"enabled": True, "action": "redact"},
            "secrets": {"enabled": True, "action": "redact"},
            "injection": {"enabled": True, "action": "warn"},
            "blocked_terms": {
                "enabled": True,
                "action": "warn",
                "terms": [{"pattern": "insider trading"}, {"pattern": "front running"}],
            },
        }
    }
}
WORDS = ["the", "quarterly", "report", "shows", "revenue", "growth", "across", "regions", "while", "costs", "remained", "stable", "and", "the", "team", "plans", "to", "review", "supplier", "contracts", "before", "the", "next", "board", "meeting", "in", "spring"]  # fmt: skip


def text(chars: int, rng: random.Random, unicode: bool) -> str:
    out: list[str] = []
    size = 0
    while size < chars:
        word = rng.choice(WORDS)
        if unicode and rng.random() < 0.02:
            word = rng.choice(["café", "naïve", "Zürich", "€42", "50\u00a0%", "—"])
        out.append(word)
        size += len(word) + 1
    return " ".join(out)[:chars]


def step_request(rng: random.Random, unicode: bool) -> tuple[list[dict[str, Any]], GenerationOptions | None]:
    return [
        {"role": "user", "content": text(400, rng, unicode)},
        {"role": "user", "content": "Summarise the figures."},
        {"role": "assistant", "content": text(500, rng, unicode)},
        {"role": "user", "content": "Check the summary and give the final answer."},
    ], None


def tool_request(rng: random.Random, unicode: bool) -> tuple[list[dict[str, Any]], GenerationOptions | None]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": text(300, rng, unicode)}]
    for i in range(4):
        messages.append({"role": "user", "content": text(250, rng, unicode), "name": f"user{i}"})
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{i}",
                        "type": "function",
                        "function": {"name": "lookup", "arguments": '{"q": "x"}'},
                    }
                ],
            }
        )
    messages.append({"role": "tool", "tool_call_id": "call_3", "content": text(300, rng, unicode)})
    tools = tuple(
        {
            "type": "function",
            "function": {
                "name": f"tool{j}",
                "description": text(120, rng, unicode),
                "parameters": {
                    "type": "object",
                    "properties": {
                        f"p{k}": {"type": "string", "description": text(40, rng, unicode)} for k in range(4)
                    },
                    "required": ["p0"],
                },
            },
        }
        for j in range(3)
    )
    return messages, GenerationOptions(tools=tools, stop=("END",))


def big_request(rng: random.Random, unicode: bool) -> tuple[list[dict[str, Any]], GenerationOptions | None]:
    return [{"role": "user", "content": text(100_000, rng, unicode)}], None


def measure(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.95) - 1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    spec = parse_spec(POLICY)
    open_gate = gate_without_policy()
    print(
        f"{'request':<22} {'text':<8} {'read only':>16} {'policy, cold':>16} {'policy, warm':>16}   (µs, median / p95)"
    )
    for name, build, repeat in (
        ("worker step ~1 KB", step_request, args.repeat),
        ("/v1 tools ~3 KB", tool_request, args.repeat),
        ("one message 100 KB", big_request, max(5, args.repeat // 20)),
    ):
        for unicode in (False, True):
            rng = random.Random(39)
            messages, options = build(rng, unicode)
            read = measure(lambda m=messages, o=options: open_gate.admit(m, options=o), repeat)

            def cold(m: Any = messages, o: Any = options) -> object:
                return OutboundGate(OutboundChecks(spec.guardrails)).admit(m, options=o)

            warm_gate = OutboundGate(OutboundChecks(spec.guardrails))
            warm_gate.admit(messages, options=options)
            cold_t = measure(cold, repeat)
            warm = measure(lambda m=messages, o=options, g=warm_gate: g.admit(m, options=o), repeat)
            label = "unicode" if unicode else "ascii"
            print(
                f"{name:<22} {label:<8} {read[0]:>8.0f} / {read[1]:<6.0f} {cold_t[0]:>8.0f} / {cold_t[1]:<6.0f}"
                f" {warm[0]:>8.0f} / {warm[1]:<6.0f}"
            )


if __name__ == "__main__":
    main()
