"""Guardrail latency per check on 1 KB and 100 KB inputs (pure Python, no database, no model).

    .venv/bin/python bench/guardrails_latency.py [--repeat N]

Each check runs alone through `apps.policies.guardrails.run_stage` (the path the engine hooks
take) on English-like text with a little PII sprinkled in (so detectors do real work and the
redact path runs). Reports the median and p95 wall time per call in milliseconds. The model
judge is measured with an instant in-process worker, i.e. our overhead only (a real judge adds
one model call). Plan validation (`check_plan`) is included for scale.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "conductor_web.settings.test")

from apps.engine.plan import Plan, PlanStep
from apps.engine.types import Usage, WorkerInfo, WorkerResult
from apps.policies.constraints import PlanFacts, check_plan
from apps.policies.guardrails import StageEnv, run_stage
from apps.policies.spec import parse_spec

WORDS = [
    "the",
    "quarterly",
    "report",
    "shows",
    "revenue",
    "growth",
    "across",
    "regions",
    "while",
    "costs",
    "remained",
    "stable",
    "and",
    "the",
    "team",
    "plans",
    "to",
    "review",
    "supplier",
    "contracts",
    "before",
    "the",
    "next",
    "board",
    "meeting",
    "in",
    "spring",
    "with",
    "updated",
    "forecasts",
]
SPRINKLES = [
    "contact jane.doe@example.com",
    "card 4242 4242 4242 4242",
    "call +44 20 7946 0958",
    "IBAN DE89 3704 0044 0532 0130 00",
    "host 10.0.0.12",
]


def make_text(size: int, seed: int = 7) -> str:
    rng = random.Random(seed)
    parts: list[str] = []
    n = 0
    while n < size:
        piece = rng.choice(SPRINKLES) if rng.random() < 0.02 else rng.choice(WORDS)
        parts.append(piece)
        n += len(piece) + 1
    return " ".join(parts)[:size]


class InstantJudge:
    info = WorkerInfo(key="judge", name="judge", model="judge", provider="test")

    def complete(self, messages, **kwargs):
        return WorkerResult('{"verdict":"pass","reason":"ok"}', Usage(1, 1), 0.0, "judge", None, False)


CHECKS = {
    "secrets": {"secrets": {"enabled": True, "action": "redact"}},
    "pii": {"pii": {"enabled": True, "action": "redact"}},
    "injection": {"injection": {"enabled": True, "action": "warn"}},
    "blocked_terms": {
        "blocked_terms": {
            "enabled": True,
            "action": "warn",
            "terms": [{"pattern": f"term{i}", "kind": "keyword"} for i in range(20)]
            + [{"pattern": r"\bproject\s+falcon\b", "kind": "regex"}],
        }
    },
    "length": {"length": {"enabled": True, "action": "warn", "max_chars": 200_000}},
    "json_schema": {"json_schema": {"enabled": True, "action": "warn", "schema": {"type": "object"}}},
    "model_judge (overhead)": {
        "model_judge": {
            "enabled": True,
            "action": "warn",
            "judges": [{"name": "j", "worker": "judge", "prompt": "p"}],
        }
    },
}


def measure(fn, repeat: int) -> tuple[float, float]:
    fn()  # warm caches (compiled patterns, validators)
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.95) - 1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=50)
    args = ap.parse_args()
    texts = {"1 KB": make_text(1024), "100 KB": make_text(100 * 1024)}
    judge = InstantJudge()
    env = StageEnv(resolve_worker={"judge": judge}.get)
    print(f"python {sys.version.split()[0]}, repeat={args.repeat}; median / p95 ms per call")
    print(f"{'check':<24}" + "".join(f"{label:>22}" for label in texts))
    for name, cfg in CHECKS.items():
        stage = parse_spec({"guardrails": {"output": cfg}}).guardrails.output
        row = f"{name:<24}"
        for text in texts.values():
            med, p95 = measure(lambda t=text, s=stage: run_stage("output", s, t, env=env), args.repeat)
            row += f"{med:>12.3f} / {p95:>7.3f}"
        print(row)
    everything = parse_spec(
        {"guardrails": {"input": {k: v for cfg in list(CHECKS.values())[:5] for k, v in cfg.items()}}}
    ).guardrails.input
    row = f"{'all five regex checks':<24}"
    for text in texts.values():
        med, p95 = measure(lambda t=text: run_stage("input", everything, t), args.repeat)
        row += f"{med:>12.3f} / {p95:>7.3f}"
    print(row)
    infos = [
        WorkerInfo(key=f"w{i}", name="w", model="m", provider="test", tags=("external",)) for i in range(4)
    ]
    plan = Plan(tuple(PlanStep(i, i % 4, "x", (i - 1,) if i else ()) for i in range(6)))
    cons = parse_spec(
        {"constraints": {"max_steps": {"value": 4}, "workers": {"denied_workers": ["w0"]}}}
    ).constraints
    med, p95 = measure(lambda: check_plan(plan, infos, cons, PlanFacts("q")), args.repeat * 10)
    print(f"{'check_plan (6→4, repair)':<24}{med:>12.3f} / {p95:>7.3f}")


if __name__ == "__main__":
    main()
