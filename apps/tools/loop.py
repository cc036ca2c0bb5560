"""The Django side of ``apps.engine.tools_loop``: the tools a plan step may see and the runner
its tool calls go through (``tool_call`` with the step's grant: policy, approvals, output gate
and audit as everywhere)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol
from uuid import UUID

from django.db import connection

from apps.core.types import Actor
from apps.engine.tools_loop import ToolRun, ToolSpec
from apps.policies.services import effective_policy
from apps.policies.spec import EffectivePolicy
from apps.tools import selectors
from apps.tools.calls import tool_call
from apps.tools.models import CallStatus, ToolCall


class ToolJournal(Protocol):
    """The run's resume journal (``apps.runs.journal.CallJournal``, a layer above this one)."""

    def take_tool(self, digest: str) -> dict[str, Any] | None: ...

    def record_tool(self, digest: str, qualified: str, result: dict[str, Any]) -> None: ...


def _model_text(status: str, rule: str, message: str, output: str) -> str:
    if status == CallStatus.SUCCEEDED:
        return output
    return f"[tool call {status} ({rule}): {message}]"


def tools_for_step(
    team: Any, granted: Sequence[str], effective: EffectivePolicy | None = None
) -> list[ToolSpec]:
    """What the step's worker is offered: granted by the plan, allowed by the policy, accepted and
    current. The description is the accepted version's, never what the server says now."""
    policy = (effective or effective_policy(team)).spec.tools
    blocked = {r.tool for r in policy.rules if r.action == "block"}
    out: list[ToolSpec] = []
    for name in dict.fromkeys(granted):
        if name in policy.denied_tools or name in blocked or policy.default_action == "block":
            continue
        if policy.allowed_tools is not None and name not in policy.allowed_tools:
            continue
        tool = selectors.tool_by_name(team, name)
        version = selectors.usable_version(tool) if tool is not None else None
        if version is not None:
            out.append(
                ToolSpec(name=name, description=version.description, input_schema=version.input_schema)
            )
    return out


def step_tool_runner(
    *,
    team: Any,
    granted: Sequence[str],
    run_id: UUID | None = None,
    step_index: int | None = None,
    actor: Actor = None,
    effective: EffectivePolicy | None = None,
    journal: ToolJournal | None = None,
    digest: Callable[[int | None, str, Any], str] | None = None,
) -> Callable[[str, dict[str, Any]], ToolRun]:
    grant = tuple(granted)

    def run(qualified: str, arguments: dict[str, Any]) -> ToolRun:
        key = digest(step_index, qualified, arguments) if journal is not None and digest else ""
        if key and journal is not None and (done := journal.take_tool(key)) is not None:
            # Answered by an earlier attempt of this run: not called again (no row, no audit:
            # the first attempt recorded both).
            return ToolRun(
                status=done["status"], text=done["text"], rule=done["rule"], arguments=done["arguments"]
            )

        flush = getattr(journal, "before_call", None)
        if key and flush is not None:
            flush()  # the worker's answer that asked for this call is journaled before it runs

        def journaled(call: ToolCall) -> None:
            if key and journal is not None:
                text = _model_text(call.status, call.rule, call.message, call.output)
                journal.record_tool(
                    key,
                    qualified,
                    {"status": call.status, "rule": call.rule, "text": text, "arguments": call.arguments},
                )

        outcome = tool_call(
            team=team,
            qualified=qualified,
            arguments=arguments,
            actor=actor,
            run_id=run_id,
            step_index=step_index,
            granted=grant,
            effective=effective,
            on_recorded=journaled if key else None,
        )
        text = _model_text(outcome.status, outcome.rule, outcome.message, outcome.output)
        shown = outcome.call.arguments if outcome.call is not None else {}
        hold = None
        if outcome.status == CallStatus.PENDING_APPROVAL and run_id is not None and outcome.approval_id:
            # Inside a run the call pauses the run on this approval (apps.runs.approvals).
            hold = {
                "tool_approval": outcome.approval_id,
                "digest": outcome.call.arguments_digest if outcome.call is not None else "",
            }
        return ToolRun(status=outcome.status, text=text, rule=outcome.rule, arguments=shown, hold=hold)

    return run


class RunToolPort:
    """``apps.engine.tools_loop.ToolPort`` for one run: lazy, so a run whose plan grants no tool
    (every pass-through and fixed-strategy run) costs no query."""

    def __init__(
        self,
        *,
        team: Any,
        run_id: UUID,
        actor_id: int | None,
        effective: EffectivePolicy,
        journal: ToolJournal | None = None,
        digest: Callable[[int | None, str, Any], str] | None = None,
    ) -> None:
        self.team = team
        self.journal = journal
        self.digest = digest
        self.run_id = run_id
        self.actor_id = actor_id
        self.effective = effective
        self._catalog: list[ToolSpec] | None = None
        self._actor: Any = None
        self._owner_thread = threading.get_ident()

    def catalog(self) -> list[ToolSpec]:
        """Every tool the team may grant now (the conductor's prompt)."""
        if self._catalog is None:
            names = [
                t.qualified_name
                for server in selectors.servers_for_team(self.team)
                if server.enabled
                for t in server.tools.all()
            ]
            self._catalog = tools_for_step(self.team, names, self.effective)
        return self._catalog

    def _release(self) -> None:
        if threading.get_ident() != self._owner_thread:
            # Engine step threads are short-lived: leave no connection behind (as the sink does).
            connection.close()

    def _user(self) -> Any:
        if self._actor is None and self.actor_id is not None:
            from django.contrib.auth import get_user_model

            self._actor = get_user_model().objects.filter(pk=self.actor_id).first()
        return self._actor

    def for_step(self, step: Any) -> tuple[list[ToolSpec], Callable[[str, dict[str, Any]], ToolRun]] | None:
        granted = tuple(getattr(step, "tools", ()) or ())
        if not granted:
            return None
        try:
            specs = tools_for_step(self.team, granted, self.effective)
            actor = self._user()
        finally:
            self._release()
        runner = step_tool_runner(
            team=self.team,
            granted=granted,
            run_id=self.run_id,
            step_index=step.index,
            actor=actor,
            effective=self.effective,
            journal=self.journal,
            digest=self.digest,
        )

        def run(qualified: str, arguments: dict[str, Any]) -> ToolRun:
            try:
                return runner(qualified, arguments)
            finally:
                self._release()

        return specs, run
