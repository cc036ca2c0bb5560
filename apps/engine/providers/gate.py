"""The outbound gate: every request to a model provider passes it before a socket opens (issue 39).

Worker steps, the conductor's planning calls, guardrail judges, feedback evaluators, replays,
health checks and ``/v1`` pass-through all reach a provider through a ``Worker`` built by
``apps.engine.providers.build_worker``, and every worker is built with an ``OutboundGate`` (the
constructor has no default: a worker without one cannot be made). ``Worker.complete`` hands its
arguments to ``OutboundGate.admit``, which

1. reads every text-bearing field of the request (``request.text_fields``: message contents and
   names, tool calls' ids, names and arguments, ``tool_call_id``, tools' names, descriptions and
   JSON schemas, ``stop``, the response format's schema, the structured-output schema); a field it
   cannot read refuses the request, naming the field;
2. asks the policy (``apps.engine.hooks.OutboundPolicy``, filled by ``apps.policies``) about all of
   them at once; the policy redacts, flags or blocks;
3. returns an ``Admitted`` request (sealed: only ``admit`` makes one), which is all a provider
   turns into wire format, or raises ``ProviderRequestRefused`` (a ``ProviderError`` that is never
   retried) naming the field and the rule.

The provider sends an admitted request inside ``Admitted.on_wire()``; the egress-checked HTTP
client (``_egress_http``), the same place that checks the resolved address at connect time,
refuses any request sent outside it. A code path that reaches an SDK client some other way opens
no socket.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from apps.engine.checks import CheckResult, OutboundField, OutboundPolicy, OutboundVerdict
from apps.engine.egress import EgressDenied
from apps.engine.events import CheckStatus
from apps.engine.generation import GenerationOptions
from apps.engine.providers.base import ProviderError
from apps.engine.providers.request import ProviderRequest, UnreadableField, rewritten, text_fields
from apps.engine.types import Message

_SEAL = object()
_on_wire: ContextVar[Admitted | None] = ContextVar("outbound_admitted", default=None)

UNREADABLE_RULE = "outbound.unreadable_field"


class ProviderRequestRefused(ProviderError):
    """The gate refused the request: nothing was sent. ``field`` names the request field,
    ``rule`` the policy rule; ``checks`` are the gate's records (no content)."""

    code = "outbound_refused"
    retryable = False

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        rule: str | None = None,
        checks: Sequence[CheckResult] = (),
    ) -> None:
        super().__init__(message)
        self.field = field
        self.rule = rule
        self.checks = tuple(checks)


class OutboundNotAdmitted(EgressDenied):
    """A request reached the HTTP client without passing the gate (raised at the socket)."""


@dataclass(frozen=True, slots=True)
class Admitted:
    """A request the gate let through, as the policy rewrote it. Made only by ``admit``."""

    request: ProviderRequest
    checks: tuple[CheckResult, ...] = ()
    seal: object = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.seal is not _SEAL:
            raise TypeError("an admitted request is made only by OutboundGate.admit")

    @property
    def messages(self) -> list[Message]:
        return [dict(m) for m in self.request.messages]

    @property
    def json_schema(self) -> dict[str, Any] | None:
        return self.request.json_schema

    @property
    def options(self) -> GenerationOptions | None:
        return self.request.options

    @property
    def inputs(self) -> list[str]:
        """An embeddings request's texts as the policy left them."""
        return list(self.request.inputs)

    @contextlib.contextmanager
    def on_wire(self) -> Iterator[None]:
        """The provider's HTTP requests for this call are sent inside this block."""
        token = _on_wire.set(self)
        try:
            yield
        finally:
            _on_wire.reset(token)


def admitted_on_wire() -> Admitted | None:
    """The admitted request this thread is sending, if any (read by the HTTP client)."""
    return _on_wire.get()


class OutboundGate:
    """Applies ``policy`` to every request a worker sends. One gate serves every worker of a
    run (or of one evaluation, one health check); it is thread-safe if the policy is."""

    __slots__ = ("policy",)

    def __init__(self, policy: OutboundPolicy) -> None:
        if not isinstance(policy, OutboundPolicy):
            raise TypeError("an OutboundGate needs an OutboundPolicy (apps.engine.hooks)")
        self.policy = policy

    def admit(
        self,
        messages: Sequence[Message],
        *,
        json_schema: dict[str, Any] | None = None,
        options: GenerationOptions | None = None,
        inputs: Sequence[str] = (),
    ) -> Admitted:
        request = ProviderRequest(tuple(messages), json_schema, options, tuple(inputs))
        try:
            fields = text_fields(request)
        except UnreadableField as err:
            check = CheckResult(
                "unreadable_field",
                "outbound",
                CheckStatus.INTERVENED,
                "block",
                f"{err.path}: the gate cannot read it ({err.why}); refused ({UNREADABLE_RULE})",
            )
            raise ProviderRequestRefused(
                f"The request field {err.path} cannot be read by the outbound gate ({err.why}); "
                "nothing was sent.",
                field=err.path,
                rule=UNREADABLE_RULE,
                checks=(check,),
            ) from None
        verdict = self.policy.check_outbound(fields)
        if verdict.blocked:
            raise ProviderRequestRefused(
                verdict.block_reason or "The outbound policy refused the request; nothing was sent.",
                field=verdict.field_path,
                rule=verdict.rule,
                checks=verdict.checks,
            )
        return Admitted(rewritten(request, verdict.texts), tuple(verdict.checks), _SEAL)


def unreadable_field(
    messages: Sequence[Message],
    *,
    json_schema: dict[str, Any] | None = None,
    options: GenerationOptions | None = None,
) -> UnreadableField | None:
    """The first field of such a request the gate could not read, or None: lets an API refuse a
    request with a 400 naming the field before a run starts, rather than block its first step."""
    try:
        text_fields(ProviderRequest(tuple(messages), json_schema, options))
    except UnreadableField as err:
        return err
    return None


class _NoPolicy:
    """Rewrites nothing (the gate still reads every field and refuses what it cannot read)."""

    def check_outbound(self, fields: Sequence[OutboundField]) -> OutboundVerdict:
        return OutboundVerdict()


def gate_without_policy() -> OutboundGate:
    """A gate that reads every field (and refuses what it cannot read) but has no policy to
    apply: for the engine used without the Django apps (its tests, benchmarks, scripts).
    Application code always builds its gate from the team's policy (``apps.policies.outbound``);
    ``tests/security/test_outbound_gate.py`` checks that no module under ``apps/`` calls this."""
    return OutboundGate(_NoPolicy())


def require_gate(gate: object) -> OutboundGate:
    """Workers take their gate through this: anything else is a programming error."""
    if not isinstance(gate, OutboundGate):
        raise TypeError("a provider worker needs an OutboundGate (apps.engine.providers.gate)")
    return gate
