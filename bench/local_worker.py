"""Local worker throughput: our LocalWorker vs llama-cpp-python called directly.

    .venv/bin/python bench/local_worker.py [--rounds 5] [--max-tokens 128]

Same model instance, same prompt, greedy decoding, `max_tokens` fixed, so both sides generate
the same tokens. Calls alternate (direct, wrapper, wrapper+stream callback) to spread machine
noise evenly; the figure is generated tokens / wall second, median over rounds. Our wrapper
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

from apps.engine import WorkerInfo, build_worker  # noqa: E402
from apps.engine.providers.local import LocalWorker  # noqa: E402

PROMPT = [{"role": "user", "content": "Write a detailed story about a lighthouse keeper and a storm."}]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()

    info = WorkerInfo("smol", "SmolLM2", "smollm2-135m-instruct", "local", timeout_s=600)
    worker = build_worker(info, temperature=0.0)
    assert isinstance(worker, LocalWorker)
    llm = worker.load().llm
    n = args.max_tokens

    def direct() -> tuple[float, int]:
        t0 = time.perf_counter()
        out = llm.create_chat_completion(messages=PROMPT, max_tokens=n, temperature=0.0)
        return time.perf_counter() - t0, out["usage"]["completion_tokens"]

    def wrapped() -> tuple[float, int]:
        t0 = time.perf_counter()
        r = worker.complete(PROMPT, max_tokens=n)
        return time.perf_counter() - t0, r.usage.output_tokens

    def wrapped_stream() -> tuple[float, int]:
        t0 = time.perf_counter()
        r = worker.complete(PROMPT, max_tokens=n, on_delta=lambda s: None)
        return time.perf_counter() - t0, r.usage.output_tokens

    direct()  # warm-up: load, first prompt evaluation
    wrapped()
    rates: dict[str, list[float]] = {"direct": [], "wrapper": [], "wrapper+on_delta": []}
    tokens: dict[str, int] = {}
    for _ in range(args.rounds):
        for name, fn in (("direct", direct), ("wrapper", wrapped), ("wrapper+on_delta", wrapped_stream)):
            seconds, generated = fn()
            rates[name].append(generated / seconds)
            tokens[name] = generated
    base = statistics.median(rates["direct"])
    print(f"SmolLM2-135M Q4_1, n_ctx=2048, n_threads=2, {n} max tokens, {args.rounds} rounds (median tokens/s)")
    for name, values in rates.items():
        med = statistics.median(values)
        print(f"{name:>18}: {med:7.1f} tok/s  ({tokens[name]} tokens)  overhead {100 * (base - med) / base:+.1f}%")


if __name__ == "__main__":
    main()
