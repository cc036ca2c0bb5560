"""Policy replay throughput: a draft and the policy in force over N recorded runs (pure Python).

    .venv/bin/python bench/policy_replay.py --runs 200 --repeat 5

No database and no model: the runs are built in memory with the shape `apps.policies.views.recorded_runs`
gives the replay (a ~600-character request, a 3-step plan, three step outputs, an answer), so
the figure is the replay's own cost; the page adds one query for runs, one for their steps and
one for their plan events.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "conductor_web.settings")

import django

django.setup()

from apps.engine.types import WorkerInfo  # noqa: E402
from apps.policies.dry_run import RecordedRun, RecordedStep, replay_runs  # noqa: E402
from apps.policies.spec import EffectivePolicy, PolicySpec, parse_spec  # noqa: E402

TEXT = (
    "Please summarise the quarterly report for the board and e-mail it to jane.doe@example.com; "
    "include the revenue table, the hiring plan and the open risks. Call +44 20 7946 0958 if unclear. "
) * 3

DRAFT = {
    "constraints": {"max_steps": {"value": 2, "action": "repair"}},
    "guardrails": {
        "input": {"pii": {"enabled": True, "action": "redact"}, "injection": {"enabled": True}},
        "step_output": {"secrets": {"enabled": True}},
        "output": {
            "pii": {"enabled": True, "action": "require_review"},
            "length": {"enabled": True, "max_chars": 4000},
        },
    },
}


def make_runs(n: int) -> list[RecordedRun]:
    infos = tuple(WorkerInfo(key=f"w{i}", name=f"W{i}", model="m", provider="test") for i in range(3))
    plan = {
        "steps": [
            {"index": i, "worker": i, "worker_key": f"w{i}", "instruction": f"Part {i}", "access": []}
            for i in range(3)
        ]
    }
    return [
        RecordedRun(
            run_id=str(k),
            created_at=datetime.now(UTC),
            status="succeeded",
            question=TEXT,
            answer=TEXT,
            plans=((1, plan),),
            steps=tuple(RecordedStep(i, 1, f"w{i}", TEXT) for i in range(3)),
            infos=infos,
        )
        for k in range(n)
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    runs = make_runs(args.runs)
    current, draft = EffectivePolicy(PolicySpec()), EffectivePolicy(parse_spec(DRAFT))
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        report = replay_runs(current=current, draft=draft, runs=runs)
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    print(
        f"{args.runs} runs: median {med * 1000:.0f} ms ({args.runs / med:.0f} runs/s), "
        f"min {min(times) * 1000:.0f} ms; changed {len(report.changed)} shown, "
        f"newly {dict((k, v) for k, v in report.newly.items() if v)}"
    )
    print("load average:", os.getloadavg())


if __name__ == "__main__":
    main()
