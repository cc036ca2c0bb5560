"""Local worker throughput: our LocalWorker vs llama-cpp-python called directly.

    .venv/bin/python bench/local_worker.py [--rounds 5] [--max-tokens 128]

Same model instance, same prompt, greedy decoding, `max_tokens` fixed, so both sides generate
the same tokens. Calls alternate (direct, wrapper, wrapper+stream callback) to spread machine
noise evenly. Two figures, median over rounds: tokens per wall second, and tokens per CPU second
of this process (`time.process_time`, all threads) — the CPU figure is what to read on a busy
machine, where wall time mostly measures the neighbours. Use `--threads 1` on a loaded box:
ggml's worker threads spin at barriers, so with 2 threads and a descheduled partner CPU time
inflates too. Our wrapper
always streams internally (to enforce timeouts between tokens) and counts prompt tokens with
the model's chat template, so this measures exactly that cost.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from apps.engine import WorkerInfo, build_worker
from apps.engine.providers.gate import gate_without_policy
from apps.engine.providers.local import LocalWorker

PROMPT = [{"role": "user", "content": "Write a detailed story about a lighthouse keeper and a storm."}]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    info = WorkerInfo("smol", "SmolLM2", "smollm2-135m-instruct", "local", timeout_s=600)
    worker = build_worker(info, temperature=0.0, n_threads=args.threads, gate=gate_without_policy())
    assert isinstance(worker, LocalWorker)
    llm = worker.load().llm
    n = args.max_tokens

    def direct() -> int:
        return llm.create_chat_completion(messages=PROMPT, max_tokens=n, temperature=0.0)["usage"][
            "completion_tokens"
        ]

    def wrapped() -> int:
        return worker.complete(PROMPT, max_tokens=n).usage.output_tokens

    def wrapped_stream() -> int:
        return worker.complete(PROMPT, max_tokens=n, on_delta=lambda s: None).usage.output_tokens

    direct()  # warm-up: load, first prompt evaluation
    wrapped()
    names = ("direct", "wrapper", "wrapper+on_delta")
    wall: dict[str, list[float]] = {k: [] for k in names}
    cpu: dict[str, list[float]] = {k: [] for k in names}
    tokens: dict[str, int] = {}
    for _ in range(args.rounds):
        for name, fn in zip(names, (direct, wrapped, wrapped_stream), strict=True):
            w0, c0 = time.perf_counter(), time.process_time()
            generated = fn()
            w1, c1 = time.perf_counter(), time.process_time()
            wall[name].append(generated / (w1 - w0))
            cpu[name].append(generated / (c1 - c0))
            tokens[name] = generated
    print(
        f"SmolLM2-135M Q4_1, n_ctx=2048, n_threads={args.threads}, {n} max tokens, {args.rounds} rounds (medians)"
    )
    # The wrapper's deterministic extra work, timed on its own: prompt-token counting per call.
    loaded = worker.load()
    t0 = time.perf_counter()
    for _ in range(200):
        loaded.count_prompt(PROMPT)
    count_us = (time.perf_counter() - t0) / 200 * 1e6
    gen_s = n / statistics.median(wall["direct"])
    print(
        f"prompt-token counting: {count_us:.0f} µs per call = {100 * count_us / 1e6 / gen_s:.3f}% of one generation"
    )
    print("              path  tok/wall-s  tok/CPU-s  tokens  overhead vs direct (wall, CPU)")
    base_w, base_c = statistics.median(wall["direct"]), statistics.median(cpu["direct"])
    for name in names:
        mw, mc = statistics.median(wall[name]), statistics.median(cpu[name])
        print(
            f"{name:>18}  {mw:10.1f}  {mc:9.1f}  {tokens[name]:6d}  "
            f"{100 * (base_w - mw) / base_w:+6.1f}%, {100 * (base_c - mc) / base_c:+6.1f}%"
        )


if __name__ == "__main__":
    main()
