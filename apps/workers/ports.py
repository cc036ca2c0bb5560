"""What the workers app needs from apps above it, as ports filled at app ready.

A health check calls a model provider, and every provider call passes the outbound gate with a
team's policy (issue 39). Policies sit beside workers (neither imports the other), so the gate
comes through this port: ``apps.runs`` (above both) registers it in ``RunsConfig.ready()``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from apps.engine.providers.gate import OutboundGate

# The outbound gate for a provider call made for ``team`` (None: a platform provider).
OutboundGateFactory = Callable[[Any], OutboundGate]

_outbound_gate: OutboundGateFactory | None = None


def register_outbound_gate(factory: OutboundGateFactory) -> None:
    global _outbound_gate
    _outbound_gate = factory


def outbound_gate(team: Any) -> OutboundGate:
    if _outbound_gate is None:  # a setup bug (apps.runs not installed), never user input
        raise RuntimeError("the outbound gate port is not registered (apps.runs is not ready)")
    return _outbound_gate(team)
