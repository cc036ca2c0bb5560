"""An experiment on the local pool (issue 19): the seed paper's Table 1 for SmolLM2-135M.

    .venv/bin/python bench/local_experiment.py [--questions 12] [--arms ...] [--seed 0]

Embedded mode, a fresh SQLite file under var/: migrates, seeds the demo's ``local`` pool
(SmolLM2-135M-Instruct via llama-cpp-python; three workers and a conductor, all the same model
with different roles), uploads a small labelled set (arithmetic and capitals, references checked
by the regex evaluator: the answer must contain the reference as a word), and runs it through the
ordinary experiment service (``experiment_start``: one run per question and strategy, executed by
the in-process runners) across every strategy: each single worker, MoA, PEV, conductor-mini,
conductor-ultra and the learned router (a fresh router: it routes greedily from its priors).
Prints accuracy, tokens, cost and p50 latency per strategy, per tag, and the load average.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _live_setup import prepare  # noqa: E402

# (question, reference, tag): short answers a small model can give; the regex evaluator accepts
# the reference as a whole word anywhere in the answer.
QUESTIONS = [
    ("What is 2 + 3? Answer with the number only.", "5", "arithmetic"),
    ("What is 7 + 8? Answer with the number only.", "15", "arithmetic"),
    ("What is 10 - 4? Answer with the number only.", "6", "arithmetic"),
    ("What is 6 * 7? Answer with the number only.", "42", "arithmetic"),
    ("What is 9 + 10? Answer with the number only.", "19", "arithmetic"),
    ("What is 12 / 3? Answer with the number only.", "4", "arithmetic"),
    ("What is the capital of France? Answer with the city only.", "Paris", "geography"),
    ("What is the capital of Japan? Answer with the city only.", "Tokyo", "geography"),
    ("What is the capital of Italy? Answer with the city only.", "Rome", "geography"),
    ("What is the capital of Germany? Answer with the city only.", "Berlin", "geography"),
    ("What is the capital of Spain? Answer with the city only.", "Madrid", "geography"),
    ("What is the capital of Egypt? Answer with the city only.", "Cairo", "geography"),
    ("What is 5 + 5? Answer with the number only.", "10", "arithmetic"),
    ("What is 3 * 4? Answer with the number only.", "12", "arithmetic"),
    ("What is the capital of Canada? Answer with the city only.", "Ottawa", "geography"),
    ("What is the capital of Kenya? Answer with the city only.", "Nairobi", "geography"),
    ("What is 20 - 7? Answer with the number only.", "13", "arithmetic"),
    ("What is the capital of Peru? Answer with the city only.", "Lima", "geography"),
    ("What is 8 + 9? Answer with the number only.", "17", "arithmetic"),
    ("What is the capital of Norway? Answer with the city only.", "Oslo", "geography"),
]


def _interleaved(n: int) -> list[tuple[str, str, str]]:
    """The first n questions with both tags represented about equally."""
    arith = [q for q in QUESTIONS if q[2] == "arithmetic"]
    geo = [q for q in QUESTIONS if q[2] == "geography"]
    out: list[tuple[str, str, str]] = []
    while len(out) < n and (arith or geo):
        for bucket in (arith, geo):
            if bucket and len(out) < n:
                out.append(bucket.pop(0))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--questions", type=int, default=10, help=f"at most {len(QUESTIONS)}")
    ap.add_argument("--arms", nargs="*", default=None, help="default: every strategy of the pool")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--max-output-tokens",
        type=int,
        default=64,
        help="the workers' answer budget (the answers are one word)",
    )
    ap.add_argument(
        "--conductor-max-output-tokens",
        type=int,
        default=160,
        help="the conductor's plan budget (a 3-step plan is ~100 tokens of JSON)",
    )
    ap.add_argument(
        "--timeout",
        type=float,
        default=3600,
        help="seconds after which the unfinished runs are cancelled and the table shows what finished",
    )
    args = ap.parse_args()

    # One local model serves every worker: runs execute one at a time (concurrent ones only wait
    # for the model and hit their step timeouts), and the whole queue is created at once, so a
    # run's deadline (counted from its creation) must cover the runs queued before it.
    os.environ.setdefault("RUN_THREAD_WORKERS", "1")
    os.environ.setdefault("RUN_TIMEOUT_S", "7200")
    work = ROOT / "var" / "bench_local_experiment"
    prepare(mode="embedded", work=work, name="local_experiment", sqlite_file=work / "db.sqlite3")
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    call_command("migrate", verbosity=0)

    from apps.experiments.datasets import ParsedItem
    from apps.experiments.models import Experiment
    from apps.experiments.selectors import progress, results
    from apps.experiments.services import (
        arm_choices,
        dataset_upload,
        experiment_cancel,
        experiment_refresh,
        experiment_start,
    )
    from apps.governance.models import Role
    from apps.governance.services import membership_set, team_create
    from apps.workers.demo import seed_pools
    from apps.workers.models import Pool
    from apps.workers.services import worker_update

    team = team_create(actor=None, slug="bench", name="Bench")
    user = get_user_model().objects.create_user(username="bench", password="unused-bench-password")
    membership_set(actor=None, team=team, user=user, role=Role.ADMIN)
    seed_pools({"bench": team})
    pool = Pool.objects.get(slug="local")
    # The answers are a number or a city: a short budget keeps a CPU run to minutes, not an hour.
    for entry in pool.pool_workers.select_related("worker"):
        worker_update(actor=None, worker=entry.worker, max_output_tokens=args.max_output_tokens)
    if pool.conductor_worker is not None:
        worker_update(
            actor=None, worker=pool.conductor_worker, max_output_tokens=args.conductor_max_output_tokens
        )

    chosen = _interleaved(min(args.questions, len(QUESTIONS)))
    items = [
        ParsedItem(
            index=i + 1,
            messages=[{"role": "user", "content": q}],
            reference=r"(?i)\b" + re.escape(ref) + r"\b",
            tags=[tag],
        )
        for i, (q, ref, tag) in enumerate(chosen)
    ]
    dataset = dataset_upload(actor=user, team=team, name="local arithmetic and capitals", items=items)
    arms = args.arms or arm_choices(pool)
    started = time.perf_counter()
    experiment = experiment_start(
        actor=user, dataset=dataset, pool=pool, arms=arms, evaluator="regex", seed=args.seed
    )
    print(f"{len(items)} questions x {len(arms)} strategies = {len(items) * len(arms)} runs", flush=True)
    last = -1
    timed_out = False
    while True:
        experiment = Experiment.objects.get(pk=experiment.pk)
        experiment_refresh(experiment)
        p = progress(Experiment.objects.get(pk=experiment.pk))
        if p["done"] != last:
            last = p["done"]
            print(f"  {p['done']}/{p['total']} runs done ({time.perf_counter() - started:.0f} s)", flush=True)
        if p["terminal"]:
            break
        if time.perf_counter() - started > args.timeout:
            print(f"  --timeout {args.timeout:.0f} s reached: cancelling the unfinished runs", flush=True)
            experiment_cancel(actor=user, experiment=Experiment.objects.get(pk=experiment.pk))
            timed_out = True
            break
        time.sleep(2)
    wall = time.perf_counter() - started
    load = os.getloadavg()
    res = results(Experiment.objects.get(pk=experiment.pk))

    def fmt(v: float | None, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    print()
    print(
        f"Local pool (SmolLM2-135M-Instruct Q4, llama-cpp-python, embedded mode), {len(items)} questions, "
        f"regex evaluator, seed {args.seed}, max_output_tokens workers {args.max_output_tokens} / "
        f"conductor {args.conductor_max_output_tokens}{'; CANCELLED at --timeout' if timed_out else ''}; wall {wall:.0f} s; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    print()
    print(
        "| strategy | accuracy | succeeded / finished / runs | tokens / question | cost (USD) | p50 latency (s) |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for row in res["table"]:
        lat = row["latency_p50_ms"]
        print(
            f"| {row['arm']} | {fmt(row['accuracy'], '.0%')} | {row['succeeded']} / {row['done']} / {row['n']} "
            f"| {fmt(row['tokens_mean'], '.0f')} | {fmt(row['cost_total'], '.4f')} "
            f"| {fmt(lat / 1000 if lat is not None else None, '.1f')} |"
        )
    print()
    print("| tag | " + " | ".join(res["arms"]) + " |")
    print("|---|" + "---:|" * len(res["arms"]))
    for tag in res["tags"]:
        print(f"| {tag['tag']} | " + " | ".join(fmt(c["accuracy"], ".0%") for c in tag["cells"]) + " |")


if __name__ == "__main__":
    main()
