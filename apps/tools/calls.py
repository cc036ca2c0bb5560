"""The tool gate (issue 43): every tool call — a worker's in a run, or a client's on /mcp — is
admitted here, run here, and its output checked here before anyone reads it.

Check, then do. In order, each refusal naming its rule:

1. the tool exists among the team's and the platform's servers (``tools.unknown_tool``);
2. the plan step granted it (``plan.tool_access``), when the call comes from a step;
3. the policy allows it (``tools.denied_tools``, ``tools.allowed_tools``);
4. an administrator accepted the version the server announces (``tools.version_not_accepted``);
5. the rules' actions — the stricter of ``default_action`` and every rule naming the tool
   (``tools.rules[i].action``: block; require_approval waits for an approver, item 4);
6. the arguments fit the accepted input schema (``tools.input_schema``) and every argument
   pattern (``tools.rules[i].pattern``);
7. the call, rate and cost limits (``tools.max_calls_per_run``, ``tools.rules[i].max_calls_…``);
8. the input gate's detectors on every string argument (``guardrails.input.<check>``: block
   refuses, redact masks the value before it is sent).

Then the call (egress-checked; the server must still announce the accepted version, or nothing
runs: ``tools.version_changed``), and the output gate (``tools.output.<check>``): block and
require_review withhold the output from every model and caller, redact masks it.

Every call, allowed or refused, is one ``ToolCall`` row and one audit row (digests and lengths of
arguments and output, never their text).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

import jsonschema
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from apps.audit.events import AuditEventType
from apps.audit.services import audit_record
from apps.core.types import Actor, stored_user
from apps.engine.checks import CheckResult, OutboundField
from apps.engine.events import CheckStatus
from apps.engine.toolclient import ToolChanged, ToolServerError, call_tool
from apps.policies.guardrails import run_stage
from apps.policies.outbound import OutboundChecks
from apps.policies.patterns import compile_re2
from apps.policies.services import effective_policy
from apps.policies.spec import STRICTNESS, EffectivePolicy, StageGuardrails, ToolRule
from apps.tools import selectors
from apps.tools.approvals import consume_approval, decided_against, open_approval, request_approval
from apps.tools.connect import ServerUnusable, server_spec
from apps.tools.models import CallStatus, Tool, ToolApproval, ToolCall, ToolVersion
from apps.tools.services import record_health, store_discovery
from apps.workers.egress import egress_policy


def arguments_digest(qualified: str, arguments: dict[str, Any]) -> str:
    """What an approver approves: the tool and its exact arguments."""
    canonical = json.dumps({"tool": qualified, "arguments": arguments}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class ToolCallOutcome:
    status: str
    qualified_name: str
    rule: str = ""
    message: str = ""
    output: str = ""  # what a model or caller may read: empty unless succeeded
    checks: list[dict[str, Any]] = field(default_factory=list)
    latency_ms: float | None = None
    call: ToolCall | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    approval_id: int | None = None  # pending_approval: the approval this call waits on

    @property
    def ok(self) -> bool:
        return self.status == CallStatus.SUCCEEDED

    def for_model(self) -> str:
        """What the worker's next model call reads as this tool's result."""
        if self.ok:
            return self.output
        return f"[tool call {self.status}: {self.message}]"


class _Refused(Exception):
    def __init__(self, rule: str, message: str, status: str = CallStatus.REFUSED) -> None:
        super().__init__(message)
        self.rule, self.message, self.status = rule, message, status


def _rules_for(effective: EffectivePolicy, qualified: str) -> list[tuple[int, ToolRule]]:
    return [(i, r) for i, r in enumerate(effective.spec.tools.rules) if r.tool == qualified]


def _action(effective: EffectivePolicy, rules: list[tuple[int, ToolRule]]) -> tuple[str, str]:
    """The stricter of the default and every rule naming the tool (a rule can only tighten)."""
    action, rule = effective.spec.tools.default_action, "tools.default_action"
    for i, r in rules:
        if STRICTNESS.get(r.action, 0) > STRICTNESS.get(action, 0):
            action, rule = r.action, f"tools.rules[{i}].action"
    return action, rule


def _check_arguments(
    version: ToolVersion, rules: list[tuple[int, ToolRule]], arguments: dict[str, Any]
) -> None:
    try:
        jsonschema.validate(arguments, version.input_schema or {"type": "object"})
    except jsonschema.ValidationError as err:
        where = "/".join(str(p) for p in err.absolute_path) or "arguments"
        raise _Refused("tools.input_schema", f"{where}: {err.message}"[:300]) from None
    except jsonschema.SchemaError:
        raise _Refused("tools.input_schema", "the tool's accepted input schema is not valid") from None
    for i, r in rules:
        if not r.argument:
            continue
        value = arguments.get(r.argument)
        text = value if isinstance(value, str) else json.dumps(value)
        if value is None or not compile_re2(r.pattern).fullmatch(text):
            raise _Refused(
                f"tools.rules[{i}].pattern",
                f"the argument {r.argument} does not match the pattern the policy allows for {r.tool}",
            )


def _check_limits(
    effective: EffectivePolicy,
    team: Any,
    qualified: str,
    rules: list[tuple[int, ToolRule]],
    run_id: UUID | None,
) -> Decimal | None:
    executed = [CallStatus.SUCCEEDED, CallStatus.FAILED, CallStatus.BLOCKED, CallStatus.HELD]
    tools = effective.spec.tools
    if run_id is not None and tools.max_calls_per_run is not None:
        n = ToolCall.objects.filter(run_id=run_id, status__in=executed).count()
        if n >= tools.max_calls_per_run:
            raise _Refused("tools.max_calls_per_run", f"the run already made {n} tool calls")
    mine = ToolCall.objects.filter(team=team, qualified_name=qualified, status__in=executed)
    cost: Decimal | None = None
    for i, r in rules:
        if r.max_calls_per_run is not None and run_id is not None:
            n = mine.filter(run_id=run_id).count()
            if n >= r.max_calls_per_run:
                raise _Refused(
                    f"tools.rules[{i}].max_calls_per_run", f"{qualified} was already called {n} times"
                )
        if r.max_calls_per_hour is not None:
            n = mine.filter(created_at__gte=timezone.now() - timedelta(hours=1)).count()
            if n >= r.max_calls_per_hour:
                raise _Refused(
                    f"tools.rules[{i}].max_calls_per_hour",
                    f"{qualified} was called {n} times in the last hour",
                )
        if r.cost_per_call_usd is not None:
            cost = max(cost or Decimal(0), r.cost_per_call_usd)
    for i, r in rules:
        if r.max_cost_usd_per_day is not None and cost is not None:
            start = timezone.now().replace(hour=0, minute=0, second=0, microsecond=0)
            spent = mine.filter(created_at__gte=start).aggregate(s=Sum("cost_usd"))["s"] or Decimal(0)
            if spent + cost > r.max_cost_usd_per_day:
                raise _Refused(
                    f"tools.rules[{i}].max_cost_usd_per_day",
                    f"{qualified} would cost {spent + cost} USD today, over {r.max_cost_usd_per_day}",
                )
    return cost


def _input_gate(
    effective: EffectivePolicy, arguments: dict[str, Any]
) -> tuple[dict[str, Any], list[CheckResult]]:
    """The input guardrails' detectors on every string argument: redact masks, block refuses."""
    fields = [OutboundField(f"arguments.{k}", v) for k, v in arguments.items() if isinstance(v, str)]
    if not fields:
        return arguments, []
    verdict = OutboundChecks(effective.spec.guardrails).check_outbound(fields)
    if verdict.blocked:
        raise _Refused(verdict.rule or "guardrails.input", verdict.block_reason or "an argument was refused")
    out = dict(arguments)
    for path, text in verdict.texts.items():
        out[path.removeprefix("arguments.")] = text
    return out, list(verdict.checks)


def _output_gate(effective: EffectivePolicy, text: str) -> tuple[str, str, str, list[CheckResult]]:
    """(status, text, rule, checks): the tool output as a model may read it."""
    out = effective.spec.tools.output
    checks = StageGuardrails().model_copy(
        update={"injection": out.injection, "pii": out.pii, "secrets": out.secrets}
    )
    outcome = run_stage("step_output", checks, text, on_check_error=effective.spec.guardrails.on_check_error)
    results = [
        CheckResult(c.name, "tool_output", c.status, c.action, c.detail)  # type: ignore[arg-type]
        for c in outcome.checks
    ]
    if outcome.blocked:
        rule = next((f"tools.output.{c.name}" for c in outcome.checks if c.action == "block"), "tools.output")
        return CallStatus.BLOCKED, "", rule, results
    if "require_review" in outcome.flags:
        rule = next(
            (f"tools.output.{c.name}" for c in outcome.checks if c.action == "require_review"), "tools.output"
        )
        return CallStatus.HELD, "", rule, results
    return CallStatus.SUCCEEDED, outcome.text, "", results


def _check_dict(c: CheckResult) -> dict[str, Any]:
    status = c.status.value if isinstance(c.status, CheckStatus) else str(c.status)
    return {"name": c.name, "stage": c.stage, "status": status, "action": c.action, "detail": c.detail}


def tool_call(
    *,
    team: Any,
    qualified: str,
    arguments: dict[str, Any],
    actor: Actor = None,
    api_key_id: int | None = None,
    run_id: UUID | None = None,
    step_index: int | None = None,
    granted: tuple[str, ...] | None = None,
    effective: EffectivePolicy | None = None,
    source: str = "run",
    on_recorded: Callable[[ToolCall], None] | None = None,
) -> ToolCallOutcome:
    """Admit, run and check one tool call; always records it. Never raises for a refusal.

    ``on_recorded`` is called with the stored row inside the transaction that stores it, for
    every decided call (not one waiting for an approver): the run's resume journal, so a kill
    after the server answered never repeats the call."""
    effective = effective or effective_policy(team)
    arguments = dict(arguments or {})
    digest = arguments_digest(qualified, arguments)
    tool: Tool | None = selectors.tool_by_name(team, qualified)
    version: ToolVersion | None = None
    checks: list[CheckResult] = []
    cost: Decimal | None = None
    # Arguments are stored only once the input gate read them: a refused call's arguments may be
    # exactly what a guardrail exists to keep out of every record (a key, a card number).
    gated = False
    used: ToolApproval | None = None
    started = time.perf_counter()
    try:
        if tool is None:
            raise _Refused("tools.unknown_tool", f"no tool {qualified} is registered for this team")
        if granted is not None and qualified not in granted:
            raise _Refused("plan.tool_access", f"the step was not granted {qualified}")
        tp = effective.spec.tools
        if qualified in tp.denied_tools:
            raise _Refused("tools.denied_tools", f"{qualified} is denied by the policy")
        if tp.allowed_tools is not None and qualified not in tp.allowed_tools:
            raise _Refused("tools.allowed_tools", f"{qualified} is not among the policy's allowed tools")
        version = selectors.usable_version(tool)
        if version is None:
            raise _Refused(
                "tools.version_not_accepted",
                f"{qualified} has no accepted version matching what its server announces; an administrator must accept it",
            )
        rules = _rules_for(effective, qualified)
        action, action_rule = _action(effective, rules)
        if action == "block":
            raise _Refused(action_rule, f"{qualified} is blocked by the policy")
        _check_arguments(version, rules, arguments)
        cost = _check_limits(effective, team, qualified, rules, run_id)
        arguments, checks = _input_gate(effective, arguments)
        gated = True
        if action == "require_approval":
            used = consume_approval(team, qualified, digest, run_id=run_id)
            if (
                used is None
                and run_id is not None
                and (against := decided_against(run_id, qualified, digest))
            ):
                # The approver refused this very call of this run, or nobody decided in time:
                # the worker reads the refusal as the tool's result and the step goes on.
                raise _Refused(*against)
            if used is None:
                waiting = open_approval(team, qualified, digest, run_id=run_id)
                raise _Refused(
                    action_rule,
                    f"{qualified} waits for an approver"
                    + (f" (approval {waiting.pk})" if waiting else "")
                    + "; the same call runs once approved",
                    CallStatus.PENDING_APPROVAL,
                )
        try:
            result = call_tool(
                server_spec(tool.server), egress_policy(), tool.name, arguments, expect_digest=version.digest
            )
        except ToolChanged as changed:
            record_health(tool.server, ok=True, detail="", latency_ms=None)
            if changed.tool is not None:
                store_discovery(None, tool.server, [changed.tool])
            raise _Refused("tools.version_changed", str(changed)) from None
        except (ToolServerError, ServerUnusable) as err:
            record_health(tool.server, ok=False, detail=str(err), latency_ms=None)
            raise _Refused("tools.server", str(err), CallStatus.FAILED) from None
        record_health(tool.server, ok=True, detail="", latency_ms=result.latency_ms)
        status: str
        out_checks: list[CheckResult]
        if result.is_error:
            status, text, rule, out_checks = CallStatus.FAILED, "", "tools.server", []
            message = "the tool reported an error"
            stored = result.text
        else:
            status, text, rule, out_checks = _output_gate(effective, result.text)
            message = "" if status == CallStatus.SUCCEEDED else f"the tool output was withheld ({rule})"
            stored = text if status == CallStatus.SUCCEEDED else result.text
        checks.extend(out_checks)
        return _record(
            team=team, tool=tool, version=version, qualified=qualified, arguments=arguments, digest=digest,
            status=status, rule=rule, message=message, output=text, stored=stored, checks=checks,
            latency_ms=result.latency_ms, cost=cost, actor=actor, api_key_id=api_key_id, run_id=run_id,
            step_index=step_index, source=source, used=used, effective=effective, on_recorded=on_recorded,
        )  # fmt: skip
    except _Refused as refused:
        return _record(
            team=team, tool=tool, version=version, qualified=qualified, arguments=arguments if gated else {},
            digest=digest,
            status=refused.status, rule=refused.rule, message=refused.message, output="", stored="",
            checks=checks, latency_ms=(time.perf_counter() - started) * 1000, cost=None, actor=actor,
            api_key_id=api_key_id, run_id=run_id, step_index=step_index, source=source, used=None,
            effective=effective,
        )  # fmt: skip


def _record(
    *,
    team: Any,
    tool: Tool | None,
    version: ToolVersion | None,
    qualified: str,
    arguments: dict[str, Any],
    digest: str,
    status: str,
    rule: str,
    message: str,
    output: str,
    stored: str,
    checks: list[CheckResult],
    latency_ms: float | None,
    cost: Decimal | None,
    actor: Actor,
    api_key_id: int | None,
    run_id: UUID | None,
    step_index: int | None,
    source: str,
    used: ToolApproval | None,
    effective: EffectivePolicy,
    on_recorded: Callable[[ToolCall], None] | None = None,
) -> ToolCallOutcome:
    check_rows = [_check_dict(c) for c in checks]
    with transaction.atomic():
        call = ToolCall.objects.create(
            team=team,
            tool=tool,
            version=version,
            qualified_name=qualified[:200],
            run_id=run_id,
            step_index=step_index,
            api_key_id=api_key_id,
            actor=stored_user(actor),
            source=source,
            arguments=arguments,
            arguments_digest=digest,
            status=status,
            rule=rule[:200],
            message=message[:500],
            output=stored,
            output_digest=_sha(stored) if stored else "",
            checks=check_rows,
            latency_ms=latency_ms,
            cost_usd=cost if status != CallStatus.REFUSED else None,
        )
        audit_record(
            event_type=AuditEventType.RUN_TOOL_CALLED if run_id else AuditEventType.TOOL_CALLED,
            actor=stored_user(actor),
            team=team,
            obj=call,
            object_repr=qualified[:200],
            run_id=run_id,
            api_key_id=api_key_id,
            payload={
                "tool": qualified,
                "version": version.number if version else None,
                "version_digest": version.digest if version else None,
                "status": status,
                "rule": rule,
                "arguments_sha256": digest,
                "arguments_chars": len(json.dumps(arguments)),
                "output_sha256": _sha(stored) if stored else None,
                "output_chars": len(stored),
                "step": step_index,
                "source": source,
                "checks": [{k: c[k] for k in ("name", "status", "action")} for c in check_rows],
                "approval": used.pk if used else None,
            },
        )
        if used is not None:
            ToolApproval.objects.filter(pk=used.pk).update(used_by_call=call)
        approval_id: int | None = None
        if status == CallStatus.PENDING_APPROVAL:
            waiting = open_approval(team, qualified, digest, run_id=run_id)
            if waiting is None:
                waiting = request_approval(call=call, requested_by=actor, rule=rule, effective=effective)
                message = f"{qualified} waits for an approver (approval {waiting.pk}); the same call runs once approved"
                ToolCall.objects.filter(pk=call.pk).update(message=message[:500])
            approval_id = waiting.pk
        elif on_recorded is not None:
            on_recorded(call)
    return ToolCallOutcome(
        status=status,
        qualified_name=qualified,
        rule=rule,
        message=message,
        output=output if status == CallStatus.SUCCEEDED else "",
        checks=check_rows,
        latency_ms=latency_ms,
        call=call,
        arguments=arguments,
        approval_id=approval_id,
    )
