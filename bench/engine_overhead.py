"""Engine overhead: what the orchestration itself costs, with workers that answer instantly.

    .venv/bin/python bench/engine_overhead.py [--runs 400]

Reports, for a full `run_request` (events, guardrail hooks, validation, scheduling, threads):
- median wall time per run and per step (µs), runs/s, for a 5-step chain;
- growth with plan size 1..5 (chain: each step reads the previous one);
- growth with parallelism 1..4 (a 5-step fan-out: 4 independent steps + 1 aggregator).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from decimal import Decimal
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from apps.engine import (
    Limits,
    NullSink,
    Plan,
    PlanStep,
    RunSession,
    Usage,
    WorkerInfo,
    WorkerPool,
    WorkerResult,
    run_request,
)
from apps.engine.executor import execute_round


class InstantWorker:
    def __init__(self, key: str) -> None:
        self.info = WorkerInfo(key=key, name=key, model="instant", provider="test")
        self._result = WorkerResult("ok", Usage(10, 2), 0.0, "instant", Decimal(0), True)

    def complete(
        self, messages, *, max_tokens=None, timeout=None, on_delta=None, json_schema=None
    ) -> WorkerResult:  # type: ignore[no-untyped-def]
        return self._result


class FixedPlan:
    name = "bench"
    preset = None

    def __init__(self, plan: Plan) -> None:
        self.plan = plan

    def narrow_limits(self, limits: Limits) -> Limits:
        return limits

    def run(self, session: RunSession) -> str:
        session.propose(round=1, attempt=1, source="fixed", plan=self.plan)
        execute_round(session, self.plan, round=1)
        return session.answer()


def chain(n: int) -> Plan:
    return Plan(tuple(PlanStep(i, i % 5, f"step {i}", (i - 1,) if i else ()) for i in range(n)))


def fan_out(n: int) -> Plan:
    steps = [PlanStep(i, i % 5, f"propose {i}", ()) for i in range(n - 1)]
    steps.append(PlanStep(n - 1, 0, "aggregate", "all"))
    return Plan(tuple(steps))


def measure(plan: Plan, *, runs: int, parallel: int) -> dict[str, float]:
    pool = WorkerPool([InstantWorker(f"w{i}") for i in range(5)])
    strategy = FixedPlan(plan)
    limits = Limits(max_parallel=parallel)
    sink = NullSink()
    for _ in range(20):  # warm up imports, caches, thread machinery
        run_request(run_id="warm", question="q", pool=pool, strategy=strategy, sink=sink, limits=limits)
    times: list[float] = []
    t_all = time.perf_counter()
    for i in range(runs):
        t0 = time.perf_counter()
        result = run_request(
            run_id=f"r{i}", question="q", pool=pool, strategy=strategy, sink=sink, limits=limits
        )
        times.append(time.perf_counter() - t0)
        assert result.status.value == "succeeded", result.error
    total = time.perf_counter() - t_all
    med = statistics.median(times)
    return {
        "steps": len(plan),
        "parallel": parallel,
        "median_run_us": round(med * 1e6, 1),
        "median_per_step_us": round(med * 1e6 / len(plan), 1),
        "p90_run_us": round(sorted(times)[int(0.9 * len(times))] * 1e6, 1),
        "runs_per_s": round(runs / total, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    headline = measure(chain(5), runs=args.runs, parallel=4)
    by_size = [measure(chain(n), runs=args.runs, parallel=4) for n in range(1, 6)]
    by_parallel = [measure(fan_out(5), runs=args.runs, parallel=p) for p in range(1, 5)]
    if args.json:
        print(json.dumps({"headline": headline, "by_size": by_size, "by_parallel": by_parallel}, indent=2))
        return
    print(
        f"5-step chain, instant workers, {args.runs} runs: median {headline['median_run_us']} µs/run, "
        f"{headline['median_per_step_us']} µs/step, {headline['runs_per_s']} runs/s"
    )
    print("\nplan size (chain, max_parallel=4)")
    print("steps  median µs/run  µs/step  p90 µs/run  runs/s")
    for r in by_size:
        print(
            f"{r['steps']:>5}  {r['median_run_us']:>13}  {r['median_per_step_us']:>7}  {r['p90_run_us']:>10}  {r['runs_per_s']:>6}"
        )
    print("\nparallelism (5-step fan-out: 4 independent + aggregator)")
    print("max_parallel  median µs/run  µs/step  p90 µs/run  runs/s")
    for r in by_parallel:
        print(
            f"{r['parallel']:>12}  {r['median_run_us']:>13}  {r['median_per_step_us']:>7}  {r['p90_run_us']:>10}  {r['runs_per_s']:>6}"
        )


if __name__ == "__main__":
    main()
