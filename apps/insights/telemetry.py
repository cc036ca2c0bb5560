"""OpenTelemetry traces of runs, in the GenAI semantic conventions.

On and configured only by the standard variables: ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), ``OTEL_EXPORTER_OTLP_HEADERS``, ``OTEL_SERVICE_NAME``,
``OTEL_BSP_*`` (OTLP over HTTP/protobuf). Unset: nothing is built and nothing is imported.

One trace per run, whatever process executed it: the trace id IS the run's UUID (128 bits), and
the spans are built from the run's stored events when ``run.finished`` commits, with explicit
start/end times. The tree::

    invoke_workflow <strategy>                 the run  (conductor.* attributes)
      apply_guardrail <rule>                   one per check that ran (input / step output / output)
      chat <conductor model>                   one per planning call (conductor.phase=planning)
      invoke_agent <worker>                    one per step
        chat <worker model>                    the step's model call: provider, model, usage, finish

Export goes through a BatchSpanProcessor (its own thread): a slow or dead collector costs a run
nothing. Message content is attached only when ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT
=true``, and never for a run whose answer a review holds or whose content a guardrail changed.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from contextvars import ContextVar
from datetime import datetime
from typing import TYPE_CHECKING, Any
from uuid import UUID

from apps.runs.models import Run, RunEvent
from apps.workers.models import Worker

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

    from apps.runs.observers import RunEventView

logger = logging.getLogger(__name__)

SERVICE_NAME_DEFAULT = "conductor-web"
CAPTURE_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
# ProviderKind → gen_ai.provider.name (well-known values of the semantic conventions).
PROVIDER_NAMES = {
    "openai": "openai",
    "anthropic": "anthropic",
    "openai_compatible": "openai",
    "local": "llama_cpp",
}

_trace_id: ContextVar[int | None] = ContextVar("conductor_trace_id", default=None)
_provider: tuple[int, TracerProvider] | None = None
_lock = threading.Lock()


def endpoint() -> str:
    return (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or ""
    )


def enabled() -> bool:
    return bool(endpoint()) and os.environ.get("OTEL_SDK_DISABLED", "").lower() != "true"


def capture_content() -> bool:
    return os.environ.get(CAPTURE_ENV, "").lower() == "true"


def _tracer() -> Tracer | None:
    global _provider
    if not enabled():
        return None
    with _lock:
        if _provider is None or _provider[0] != os.getpid():  # a forked child builds its own
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import SERVICE_NAME, Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

            class RunTraceIds(RandomIdGenerator):
                def generate_trace_id(self) -> int:
                    return _trace_id.get() or super().generate_trace_id()

            service = os.environ.get("OTEL_SERVICE_NAME") or SERVICE_NAME_DEFAULT
            provider = TracerProvider(
                resource=Resource.create({SERVICE_NAME: service}), id_generator=RunTraceIds()
            )
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
            _provider = (os.getpid(), provider)
        return _provider[1].get_tracer("apps.insights.telemetry")


def flush(timeout_ms: int = 10_000) -> bool:
    """Push what is queued now (tests, shutdown hooks)."""
    return _provider[1].force_flush(timeout_ms) if _provider else True


def reset() -> None:
    """Shut the exporter down; the next run re-reads the environment (tests switch collectors)."""
    global _provider
    with _lock:
        if _provider is not None:
            _provider[1].shutdown()
        _provider = None


def on_run_event(view: RunEventView) -> None:
    """After-commit observer: at ``run.finished`` build and queue the run's trace."""
    if view.type != "run.finished" or not enabled():
        return
    tracer = _tracer()
    if tracer is not None:
        export_run(tracer, view.run_id)


def _ns(dt: datetime) -> int:
    return int(dt.timestamp() * 1e9)


def _ms_before(dt: datetime, ms: Any) -> int:
    return _ns(dt) - int(float(ms or 0) * 1e6)


def _error(span: Span, message: str, error_type: str) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute("error.type", error_type)
    span.set_status(Status(StatusCode.ERROR, message[:500]))


def export_run(tracer: Tracer, run_id: UUID) -> None:
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind

    run = Run.objects.select_related("team").get(pk=run_id)
    events = list(RunEvent.objects.filter(run_id=run_id).order_by("seq").values("type", "data", "created_at"))
    if not events:
        return
    started = next((e for e in events if e["type"] == "run.started"), events[0])
    start_data = started["data"]
    conductor = start_data.get("conductor") or {}
    models = {w.get("key"): w.get("model") for w in start_data.get("workers") or []}
    if conductor.get("key"):
        models[conductor["key"]] = conductor.get("model")
    providers = {
        slug: PROVIDER_NAMES.get(kind, kind)
        for slug, kind in Worker.objects.filter(slug__in=[k for k in models if k]).values_list(
            "slug", "provider__kind"
        )
    }
    # Content only for runs nobody holds and no guardrail changed (redacted, blocked or flagged).
    touched = any(
        e["type"] == "guardrail.checked"
        and (e["data"].get("blocked") or e["data"].get("flags")
             or any(c.get("status") == "intervened" for c in e["data"].get("checks") or []))
        for e in events
    )  # fmt: skip
    content = capture_content() and not run.answer_held and not touched
    finished = events[-1]

    def model_attrs(key: str, usage: dict[str, Any] | None) -> dict[str, Any]:
        model = models.get(key) or key
        usage = usage or {}
        return {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": providers.get(key, "unknown"),
            "gen_ai.request.model": model,
            "gen_ai.response.model": model,
            "gen_ai.usage.input_tokens": int(usage.get("input_tokens") or 0),
            "gen_ai.usage.output_tokens": int(usage.get("output_tokens") or 0),
        }

    token = _trace_id.set(UUID(str(run_id)).int)
    try:
        root = tracer.start_span(
            f"invoke_workflow {run.strategy}",
            kind=SpanKind.INTERNAL,
            start_time=_ns(started["created_at"]),
            attributes={
                "gen_ai.operation.name": "invoke_workflow",
                "conductor.run_id": str(run_id),
                "conductor.team": run.team.slug,
                "conductor.policy_version": run.policy_version_id or 0,
                "conductor.strategy": run.strategy,
                "conductor.preset": run.preset,
                "conductor.status": str(finished["data"].get("status") or run.status),
                "conductor.answer_held": bool(run.answer_held),
            },
        )
    finally:
        _trace_id.reset(token)
    root_ctx = trace.set_span_in_context(root)
    step_spans: dict[int, tuple[Span, Any]] = {}
    for e in events:
        kind, data, at = e["type"], e["data"], e["created_at"]
        if kind == "guardrail.checked":
            parent = step_spans.get(data.get("step")) if data.get("stage") == "step_output" else None
            ctx = trace.set_span_in_context(parent[0]) if parent else root_ctx
            for check in data.get("checks") or []:
                if check.get("status") == "not_run":
                    continue
                status = str(check.get("status") or "")
                outcome = str(check.get("action") or "intervened") if status == "intervened" else status
                span = tracer.start_span(
                    f"apply_guardrail {check.get('name')}",
                    context=ctx,
                    start_time=_ms_before(at, check.get("latency_ms")),
                    attributes={
                        "gen_ai.operation.name": "apply_guardrail",
                        "conductor.guardrail.name": str(check.get("name") or ""),
                        "conductor.guardrail.stage": str(check.get("stage") or data.get("stage") or ""),
                        "conductor.guardrail.status": status,
                        "conductor.guardrail.action": str(check.get("action") or ""),
                        "conductor.guardrail.outcome": outcome,
                    },
                )
                if status == "failed":
                    _error(span, str(check.get("detail") or "guardrail check failed"), "guardrail_failed")
                span.end(end_time=_ns(at))
        elif kind == "plan.proposed":
            key = conductor.get("key") or "conductor"
            span = tracer.start_span(
                f"chat {models.get(key) or key}",
                context=root_ctx,
                kind=SpanKind.CLIENT,
                start_time=_ms_before(at, data.get("latency_ms")),
                attributes={
                    **model_attrs(key, data.get("usage")),
                    "conductor.phase": "planning",
                    "conductor.plan.round": int(data.get("round") or 1),
                    "conductor.plan.attempt": int(data.get("attempt") or 1),
                    "conductor.plan.source": str(data.get("source") or ""),
                    "conductor.plan.steps": len((data.get("plan") or {}).get("steps") or []),
                },
            )
            if data.get("error"):
                _error(span, str(data["error"]), "plan_rejected")
            elif content and data.get("raw"):
                span.set_attribute(
                    "gen_ai.output.messages", json.dumps([{"role": "assistant", "content": data["raw"]}])
                )
            span.end(end_time=_ns(at))
        elif kind == "step.started":
            index = int(data.get("index") or 0)
            agent = tracer.start_span(
                f"invoke_agent {data.get('worker_key')}",
                context=root_ctx,
                start_time=_ns(at),
                attributes={
                    "gen_ai.operation.name": "invoke_agent",
                    "gen_ai.agent.name": str(data.get("worker_key") or ""),
                    "conductor.step.index": index,
                    "conductor.step.round": int(data.get("round") or 1),
                    "conductor.access_list": [int(i) for i in data.get("access") or []],
                },
            )
            step_spans[index] = (agent, data.get("messages"))
        elif kind == "step.finished":
            index = int(data.get("index") or 0)
            if index not in step_spans:
                continue  # never started (skipped/blocked): no model call to show
            agent, messages = step_spans[index]
            key = str(data.get("worker_key") or "")
            status = str(data.get("status") or "failed")
            chat = tracer.start_span(
                f"chat {models.get(key) or key}",
                context=trace.set_span_in_context(agent),
                kind=SpanKind.CLIENT,
                start_time=_ms_before(at, data.get("latency_ms")),
                attributes={
                    **model_attrs(key, data.get("usage")),
                    "gen_ai.response.finish_reasons": [
                        str(data.get("finish_reason") or ("stop" if status == "succeeded" else status))
                    ],
                },
            )
            if data.get("fallback_from"):
                chat.set_attribute("conductor.fallback_from", str(data["fallback_from"]))
            if content:
                chat.set_attribute("gen_ai.input.messages", json.dumps(messages or []))
                chat.set_attribute(
                    "gen_ai.output.messages",
                    json.dumps([{"role": "assistant", "content": data.get("output") or ""}]),
                )
            agent.set_attribute("conductor.step.status", status)
            if status != "succeeded":
                for span in (chat, agent):
                    _error(span, str(data.get("error") or status), status)
            chat.end(end_time=_ns(at))
            agent.end(end_time=_ns(at))
    status = str(finished["data"].get("status") or run.status)
    if status != "succeeded":
        _error(root, str(finished["data"].get("error") or finished["data"].get("reason") or status), status)
    root.end(end_time=_ns(finished["created_at"]))
