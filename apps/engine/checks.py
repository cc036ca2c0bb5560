"""What a check records, and the outbound gate's port (issue 39). Pure Python.

``CheckResult`` is one guardrail check's record (every stage, and the outbound gate's); the
``Outbound*`` types are the port through which the gate in the provider layer
(``apps.engine.providers.gate``) asks the policy about a request. They live here, below both the
hooks and the providers, so neither has to import the other. ``apps.engine.hooks`` re-exports them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from apps.engine.events import CheckStatus

# "outbound": the gate's checks on a request leaving for a model provider (any purpose).
Stage = Literal["input", "step_output", "output", "outbound"]


@dataclass(slots=True)
class CheckResult:
    name: str
    stage: Stage
    status: CheckStatus | str
    action: str = "none"  # e.g. none, redact, block, warn, flag
    detail: str = ""
    latency_ms: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        status = self.status.value if isinstance(self.status, CheckStatus) else self.status
        return {
            "name": self.name,
            "stage": self.stage,
            "status": status,
            "action": self.action,
            "detail": self.detail,
            "latency_ms": round(self.latency_ms, 3),
        }


@dataclass(frozen=True, slots=True)
class OutboundField:
    """One text-bearing field of a provider request. ``path`` names it as the client would
    (``messages[2].name``, ``tools[0].function.description``, ``stop[1]``); ``message`` is the
    index of the message whose content it is (contents are also checked joined together, so a
    card split across two messages is found), else None."""

    path: str
    text: str
    message: int | None = None


@dataclass(slots=True)
class OutboundVerdict:
    """What the policy decided about one request. ``texts``: path → the text to send instead
    (redactions); ``checks``: one entry per intervention, naming the field and the rule (never
    the content); ``blocked``: nothing is sent, ``block_reason`` says why in plain words."""

    texts: dict[str, str] = field(default_factory=dict)
    checks: list[CheckResult] = field(default_factory=list)
    blocked: bool = False
    block_reason: str | None = None
    flags: list[str] = field(default_factory=list)
    field_path: str | None = None  # when blocked: the request field, e.g. "tools[0].function.description"
    rule: str | None = None  # when blocked: the policy rule, e.g. "guardrails.input.secrets"


@runtime_checkable
class OutboundPolicy(Protocol):
    def check_outbound(self, fields: Sequence[OutboundField]) -> OutboundVerdict: ...
