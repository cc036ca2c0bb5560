"""Tokens per question: conductor vs single vs mixture-of-agents vs planner-executor-verifier.

    .venv/bin/python bench/tokens.py [--questions 5] [--max-tokens 64] [--conductor-tokens 128]

Everything runs on the local pool: three SmolLM2-135M workers (one shared model instance, three
pool entries with different stated strengths and cost ranks) and a SmolLM2 conductor with
grammar-constrained JSON plans. Tokens are input + output as counted by the provider, including
the conductor's own planning calls (and its repair attempts). The paper's reference figures
(Conductor vs MoA, GPT-class models): 1,820 vs 11,203 tokens per question, 0.16x.
A 135M conductor rarely writes a valid multi-step plan, so the table also shows how its plans
ended (conductor / repair / fallback) — the fallback is a single step on the default worker.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from apps.engine import (
    ConductorStrategy,
    EventType,
    Limits,
    ListSink,
    MixtureOfAgentsStrategy,
    PlannerExecutorVerifierStrategy,
    SingleStrategy,
    Strategy,
    WorkerInfo,
    WorkerPool,
    build_worker,
    run_request,
)
from apps.engine.providers.gate import gate_without_policy

QUESTIONS = [
    "What is the capital of Australia?",
    "If a train travels 60 km in 45 minutes, what is its average speed in km/h?",
    "Name three renewable sources of energy.",
    "What is the opposite of 'generous'?",
    "Is 91 a prime number? Explain briefly.",
    "Translate 'good morning' into French.",
]


def local_pool(max_tokens: int, threads: int) -> WorkerPool:
    def w(key: str, strengths: str, rank: int) -> object:
        info = WorkerInfo(
            key,
            key,
            "smollm2-135m-instruct",
            "local",
            strengths=strengths,
            cost_rank=rank,
            max_output_tokens=max_tokens,
            timeout_s=900,
        )
        return build_worker(info, temperature=0.0, n_threads=threads, gate=gate_without_policy())

    workers = [
        w("smol-fast", "short factual answers", 1),
        w("smol-math", "arithmetic and reasoning", 2),
        w("smol-writer", "writing and language", 3),
    ]
    return WorkerPool(workers, default_index=0, conductor=w("smol-conductor", "planning", 1))  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--questions", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--conductor-tokens", type=int, default=128)
    # Token counts do not depend on threads; 1 thread is much faster on a CPU-contended box.
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    pool = local_pool(args.max_tokens, args.threads)
    strategies: dict[str, Strategy] = {
        "conductor": ConductorStrategy(max_tokens=args.conductor_tokens),
        "single": SingleStrategy(),
        "moa": MixtureOfAgentsStrategy(),
        "pev": PlannerExecutorVerifierStrategy(),
    }
    limits = Limits(max_tokens_per_step=args.max_tokens, step_timeout_s=900, run_timeout_s=3600)
    per: dict[str, list[int]] = {name: [] for name in strategies}
    calls: dict[str, list[int]] = {name: [] for name in strategies}
    wall: dict[str, list[float]] = {name: [] for name in strategies}
    sources: Counter[str] = Counter()
    statuses: Counter[str] = Counter()
    for qi, question in enumerate(QUESTIONS[: args.questions]):
        for name, strategy in strategies.items():
            sink = ListSink()
            t0 = time.perf_counter()
            result = run_request(
                run_id=f"{name}-{qi}",
                question=question,
                pool=pool,
                strategy=strategy,
                sink=sink,
                limits=limits,
            )
            wall[name].append(time.perf_counter() - t0)
            statuses[f"{name}:{result.status.value}"] += 1
            per[name].append(result.totals.total_tokens)
            n_calls = len(sink.of_type(EventType.STEP_STARTED)) + sum(
                1
                for e in sink.of_type(EventType.PLAN_PROPOSED)
                if e.data["source"] in ("conductor", "repair") and e.data["raw"] is not None
            )
            calls[name].append(n_calls)
            if name == "conductor":
                final = sink.of_type(EventType.PLAN_PROPOSED)[-1].data["source"]
                sources[final] += 1
            print(
                f"  q{qi} {name:>9}: {result.totals.total_tokens:5d} tokens, {n_calls} calls, {wall[name][-1]:6.1f}s, {result.status.value}",
                flush=True,
            )

    moa = statistics.mean(per["moa"])
    print(
        f"\n{args.questions} questions, local SmolLM2-135M pool (3 workers + conductor), max {args.max_tokens} tokens/step"
    )
    print("strategy   tokens/question  model calls/question  ratio to MoA  s/question")
    for name in strategies:
        mean = statistics.mean(per[name])
        print(
            f"{name:>9}  {mean:15.0f}  {statistics.mean(calls[name]):20.1f}  {mean / moa:11.2f}x  {statistics.mean(wall[name]):10.1f}"
        )
    print(f"conductor plans ended as: {dict(sources)}; statuses: {dict(statuses)}")
    print("paper reference: Conductor 1,820 vs MoA 11,203 tokens/question = 0.16x")


if __name__ == "__main__":
    main()
