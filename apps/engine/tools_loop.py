"""A worker's bounded tool-calling loop (issue 43 item 5). Pure Python, no Django.

The worker is offered the tools its step was granted (OpenAI function tools; the Anthropic worker
maps them to ``tool_use`` itself), and for at most ``max_rounds`` rounds each tool call it makes is
handed to ``run_tool`` — on the Django side ``apps.tools.calls.tool_call`` with the step's grant,
so the policy, approvals, output gate and audit apply — and the result is fed back as a ``tool``
message. Every model call goes through the worker's own outbound gate, tool results included.
The last round offers no tool choice (``tool_choice: none``), so the step ends with an answer.

Function names may not contain dots, so ``crm.lookup`` is offered as ``crm__lookup``; a name the
model invents is mapped back the same way and refused by ``run_tool`` (``plan.tool_access``).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any, Protocol

from apps.engine.events import EventType
from apps.engine.generation import GenerationOptions
from apps.engine.providers.base import ProviderError
from apps.engine.session import RunHeld
from apps.engine.types import Message, Usage, WorkerResult

MAX_ROUNDS = 4
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str  # qualified: <server slug>.<tool name>
    description: str
    input_schema: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ToolRun:
    """What ``run_tool`` answers: the status, the text the model may read, the deciding rule."""

    status: str  # succeeded | failed | refused | blocked | held | pending_approval
    text: str
    rule: str = ""
    # The arguments as the gate let them through (redacted), None when it refused them unread:
    # what the live graph may show (never the model's raw arguments, which may hold a secret).
    arguments: Mapping[str, Any] | None = None
    # For ``pending_approval`` inside a run: what the run pauses on (the host's approval id, the
    # tool, the arguments' digest, the deciding rule). The loop stops and the run waits.
    hold: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class ToolCallRecord:
    round: int
    call_id: str
    name: str
    arguments: Mapping[str, Any]
    status: str
    rule: str
    latency_ms: float
    text: str = ""  # what the model read as the result


class ToolPort(Protocol):
    """What the host application gives a run (``run_request(tools=...)``): for one plan step, the
    tools its worker is offered and the runner its calls go through, or None (no usable tool)."""

    def catalog(self) -> Sequence[ToolSpec]: ...

    def for_step(
        self, step: Any
    ) -> tuple[Sequence[ToolSpec], Callable[[str, dict[str, Any]], ToolRun]] | None: ...


class ToolApprovalHeld(ProviderError):
    """A tool call waits for an approver: the step stops here and the run pauses
    (``run.awaiting_approval``) until it is decided. Raised from the step's thread; the executor
    turns it into ``RunHeld``. On resume the step replays from the journal up to this call."""

    code = "tool_approval_required"

    def __init__(self, tool: str, rule: str, hold: Mapping[str, Any]) -> None:
        super().__init__(f"the tool call {tool} waits for an approver ({rule})")
        self.tool, self.rule, self.hold = tool, rule, dict(hold)

    def run_held(self, round: int) -> RunHeld:
        held = RunHeld(
            f"the tool call {self.tool} needs an approver ({self.rule})",
            plan=None,
            round=round,
            violations=[],
            hold={"kind": "tool", "tool": self.tool, "rule": self.rule, **self.hold},
        )
        held.error = f"A tool call waits for an approver: {self.tool} ({self.rule})"
        return held


@dataclass(slots=True)
class LoopResult:
    result: WorkerResult
    calls: list[ToolCallRecord] = field(default_factory=list)
    rounds: int = 0


def function_name(qualified: str) -> str:
    return _UNSAFE.sub("_", qualified.replace(".", "__"))[:64]


def openai_tools(tools: Sequence[ToolSpec]) -> tuple[tuple[dict[str, Any], ...], dict[str, str]]:
    """The function tools to offer and the map from function name back to the qualified name."""
    offered: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    for t in tools:
        fn = function_name(t.name)
        if fn in names:
            continue  # two names that sanitise alike: offer the first only, never guess between them
        names[fn] = t.name
        offered.append(
            {
                "type": "function",
                "function": {
                    "name": fn,
                    "description": t.description,
                    "parameters": dict(t.input_schema) or {"type": "object", "properties": {}},
                },
            }
        )
    return tuple(offered), names


def _add(a: Decimal | None, b: Decimal | None) -> Decimal | None:
    if a is None or b is None:
        return None
    return a + b


def run_tool_loop(
    worker: Any,
    messages: list[Message],
    tools: Sequence[ToolSpec],
    run_tool: Callable[[str, dict[str, Any]], ToolRun],
    *,
    max_rounds: int = MAX_ROUNDS,
    max_tokens: int | None = None,
    timeout: float | None = None,
    on_call: Callable[[ToolCallRecord], None] | None = None,
) -> LoopResult:
    """Run the worker with ``tools`` until it answers without calling one, or ``max_rounds`` ends."""
    offered, names = openai_tools(tools)
    msgs: list[Any] = list(messages)
    out = LoopResult(result=None)  # type: ignore[arg-type]
    usage = Usage()
    cost: Decimal | None = Decimal(0)
    latency = 0.0
    priced = True
    for round_no in range(1, max(1, max_rounds) + 1):
        last = round_no == max_rounds
        options = (
            GenerationOptions(tools=offered, tool_choice="none" if last else "auto") if offered else None
        )
        res: WorkerResult = worker.complete(msgs, max_tokens=max_tokens, timeout=timeout, options=options)
        out.rounds = round_no
        usage = Usage(
            usage.input_tokens + res.usage.input_tokens, usage.output_tokens + res.usage.output_tokens
        )
        cost, latency, priced = _add(cost, res.cost_usd), latency + res.latency_ms, priced and res.priced
        if not res.tool_calls or last:
            out.result = replace(res, usage=usage, cost_usd=cost, latency_ms=latency, priced=priced)
            return out
        msgs.append(
            {"role": "assistant", "content": res.text, "tool_calls": [dict(c) for c in res.tool_calls]}
        )
        for call in res.tool_calls:
            fn = call.get("function") or {}
            fname = str(fn.get("name") or "")
            qualified = names.get(fname) or fname.replace("__", ".")
            started = time.perf_counter()
            try:
                arguments = json.loads(fn.get("arguments") or "{}")
                if not isinstance(arguments, dict):
                    raise ValueError("arguments must be a JSON object")
            except ValueError:
                ran = ToolRun(
                    "refused", "[tool call refused: the arguments are not a JSON object]", "tools.arguments"
                )
                arguments = {}
            else:
                ran = run_tool(qualified, arguments)
            record = ToolCallRecord(
                round=round_no,
                call_id=str(call.get("id") or ""),
                name=qualified,
                arguments=dict(ran.arguments) if ran.arguments is not None else {},
                status=ran.status,
                rule=ran.rule,
                latency_ms=(time.perf_counter() - started) * 1000,
                text=ran.text,
            )
            out.calls.append(record)
            if on_call is not None:
                on_call(record)
            if ran.status == "pending_approval" and ran.hold is not None:
                # Nothing after this call runs until an approver decides: the run pauses.
                raise ToolApprovalHeld(qualified, ran.rule, ran.hold)
            msgs.append({"role": "tool", "tool_call_id": record.call_id, "content": ran.text})
    raise AssertionError("unreachable: the last round returns")  # pragma: no cover


def complete_with_tools(
    session: Any,
    step: Any,
    worker: Any,
    messages: list[Message],
    *,
    max_tokens: int | None,
    timeout: float | None,
    extra: Mapping[str, Any] | None = None,
) -> WorkerResult | None:
    """The executor's hook: a step granted tools runs the loop; None means "call the worker as
    usual" (no tools granted or usable, no tool port, or an API client's own tools on this call)."""
    port: ToolPort | None = getattr(session, "tools", None)
    if port is None or not getattr(step, "tools", ()) or extra:
        return None
    found = port.for_step(step)
    if found is None:
        return None
    specs, runner = found
    if not specs:
        return None

    def on_call(record: ToolCallRecord) -> None:
        session.emitter.emit(
            EventType.TOOL_CALLED,
            {
                "index": step.index,
                "round": record.round,
                "call_id": record.call_id,
                "tool": record.name,
                "arguments": dict(record.arguments),
                "status": record.status,
                "rule": record.rule,
                "output": record.text[:4000],
                "latency_ms": round(record.latency_ms, 3),
            },
        )

    return run_tool_loop(
        worker,
        messages,
        specs,
        runner,
        max_rounds=MAX_ROUNDS,
        max_tokens=max_tokens,
        timeout=timeout,
        on_call=on_call,
    ).result
