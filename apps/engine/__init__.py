"""Conductor Web orchestration engine — pure Python, no Django.

Synchronous by design (run it in a thread or a Celery task): provider SDK clients, llama-cpp and
the Django sinks are all synchronous; steps fan out to helper threads inside the engine.

Public API (everything below is re-exported here):

types          Message, Usage, WorkerInfo, WorkerResult, Limits, Totals
providers      Worker (protocol: `info` + `complete(messages, *, max_tokens, timeout, on_delta,
               json_schema) -> WorkerResult`), build_worker(info, *, gate, kind, base_url,
               api_key, model, model_path, ...), OutboundGate (every request passes it before a
               socket opens; issue 39), gate_without_policy, ProviderRequestRefused, PROVIDER_KINDS, ProviderError and subclasses
               ProviderAuthError / ProviderModelNotFound / ProviderContextTooLong /
               ProviderRateLimited / ProviderUnavailable / ProviderTimeout / ProviderBadRequest /
               ProviderCancelled,
               call_with_retries, price_call, default_model_path
plan           Plan, PlanStep, PlanError, CONDUCTOR_SELF (= -1; the conductor may also write
               `pool_size`), parse_plan, build_plan, validate_plan, plan_json_schema,
               plan_to_dict, plan_from_dict, plan_to_text
events         EventType, Event, EventSink, Emitter, ListSink, NullSink, StepStatus,
               RunStatus, CheckStatus (payload shapes: see apps.engine.events docstring)
hooks          GovernanceHooks, NoGovernance, RunContext, CheckResult, GuardrailOutcome,
               PlanValidation, Violation, StepGate, OutboundPolicy, OutboundField, OutboundVerdict
pool           WorkerPool(workers, default_index=0, conductor=None)
session        RunSession (what a Strategy works with), CancelToken (subclass `is_cancelled()`
               to poll the DB), RunAborted, StepRecord
executor       execute_plan, build_messages (the one place worker context is assembled)
slots / calls  (not re-exported) a worker's slots: steps beyond its capacity wait
               (step.waiting / step.running); CallScope: an abandoned call is cancelled (issue 44)
strategies     Strategy, ConductorStrategy(preset=None|"mini"|"ultra"), SingleStrategy,
               MixtureOfAgentsStrategy, PlannerExecutorVerifierStrategy, PRESETS,
               build_strategy(name, preset=...)
runner         run_request(*, run_id, question, pool, strategy, sink, hooks=None, cancel=None,
               limits=None, metadata=None) -> RunResult

Typical use from the Django side::

    info = WorkerInfo(key=row.slug, name=row.name, model=row.model, provider=row.kind, ...)
    gate = OutboundGate(policy_hooks)  # the team's policy on every field of every request
    worker = build_worker(info, gate=gate, kind=row.kind, base_url=row.base_url, api_key=secret)
    pool = WorkerPool([worker, ...], default_index=0, conductor=conductor_worker)
    result = run_request(run_id=str(run.pk), question=q, pool=pool,
                         strategy=build_strategy("conductor", preset="mini"),
                         sink=DjangoSink(run), hooks=policy_hooks, cancel=DbCancelToken(run.pk),
                         limits=Limits(max_steps=5))
"""

from apps.engine.events import (
    CheckStatus,
    Emitter,
    Event,
    EventSink,
    EventType,
    ListSink,
    NullSink,
    RunStatus,
    StepStatus,
)
from apps.engine.executor import build_messages, execute_plan
from apps.engine.hooks import (
    CheckResult,
    GovernanceHooks,
    GuardrailOutcome,
    NoGovernance,
    OutboundField,
    OutboundPolicy,
    OutboundVerdict,
    PlanValidation,
    RunContext,
    StepGate,
    Violation,
)
from apps.engine.plan import (
    CONDUCTOR_SELF,
    Plan,
    PlanError,
    PlanStep,
    build_plan,
    parse_plan,
    plan_from_dict,
    plan_json_schema,
    plan_to_dict,
    plan_to_text,
    validate_plan,
)
from apps.engine.pool import WorkerPool
from apps.engine.providers.base import (
    ProviderAuthError,
    ProviderBadRequest,
    ProviderContextTooLong,
    ProviderError,
    ProviderModelNotFound,
    ProviderRateLimited,
    ProviderTimeout,
    ProviderUnavailable,
    Worker,
    call_with_retries,
)
from apps.engine.providers.factory import PROVIDER_KINDS, build_worker
from apps.engine.providers.gate import OutboundGate, ProviderRequestRefused, gate_without_policy
from apps.engine.providers.local import default_model_path
from apps.engine.providers.pricing import price_call
from apps.engine.runner import RunResult, run_request
from apps.engine.session import CancelToken, RunAborted, RunSession, StepRecord
from apps.engine.strategies import (
    PRESETS,
    ConductorStrategy,
    MixtureOfAgentsStrategy,
    PlannerExecutorVerifierStrategy,
    SingleStrategy,
    Strategy,
    build_strategy,
)
from apps.engine.types import Limits, Message, Totals, Usage, WorkerInfo, WorkerResult

__all__ = [
    "CONDUCTOR_SELF",
    "PRESETS",
    "PROVIDER_KINDS",
    "CancelToken",
    "CheckResult",
    "CheckStatus",
    "ConductorStrategy",
    "Emitter",
    "Event",
    "EventSink",
    "EventType",
    "GovernanceHooks",
    "GuardrailOutcome",
    "Limits",
    "ListSink",
    "Message",
    "MixtureOfAgentsStrategy",
    "NoGovernance",
    "NullSink",
    "OutboundField",
    "OutboundGate",
    "OutboundPolicy",
    "OutboundVerdict",
    "Plan",
    "PlanError",
    "PlanStep",
    "PlanValidation",
    "PlannerExecutorVerifierStrategy",
    "ProviderAuthError",
    "ProviderBadRequest",
    "ProviderContextTooLong",
    "ProviderError",
    "ProviderModelNotFound",
    "ProviderRateLimited",
    "ProviderRequestRefused",
    "ProviderTimeout",
    "ProviderUnavailable",
    "RunAborted",
    "RunContext",
    "RunResult",
    "RunSession",
    "RunStatus",
    "SingleStrategy",
    "StepGate",
    "StepRecord",
    "StepStatus",
    "Strategy",
    "Totals",
    "Usage",
    "Violation",
    "Worker",
    "WorkerInfo",
    "WorkerPool",
    "WorkerResult",
    "build_messages",
    "build_plan",
    "build_strategy",
    "build_worker",
    "call_with_retries",
    "default_model_path",
    "execute_plan",
    "gate_without_policy",
    "parse_plan",
    "plan_from_dict",
    "plan_json_schema",
    "plan_to_dict",
    "plan_to_text",
    "price_call",
    "run_request",
    "validate_plan",
]
