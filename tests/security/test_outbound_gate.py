"""One outbound gate (issue 39): every place that can call a model provider goes through it.

Three kinds of proof:

1. The code, scanned (AST): the only modules that import an SDK, an HTTP client or llama-cpp are
   the provider modules (and the budget-alert webhook, which is not a model provider); every call
   that builds a provider worker passes ``gate=`` and no application module uses the policy-less
   gate; every caller of ``Worker.complete`` is listed here with the reason it is gated. A new
   path fails this test until it is added on purpose.
2. The guards, at run time: a worker cannot be built without a gate, an admitted request cannot be
   forged, and an SDK client reached around the gate opens no socket (the fake provider receives
   nothing).
3. The callers, at run time: a conductor run's planning call and steps, and a health check, send
   only what a recording gate saw, and so does "Test connection" on a provider form's unsaved settings. (Worker steps, ``/v1`` pass-through, guardrail judges,
   evaluators and experiments are proven on the provider's received bytes in
   ``test_outbound_v1_fields.py``, ``test_outbound_judges.py`` and ``test_evasions.py``.)
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import openai
import pytest

from apps.engine.checks import OutboundField, OutboundVerdict
from apps.engine.egress import EgressPolicy
from apps.engine.events import ListSink
from apps.engine.providers import build_worker
from apps.engine.providers.gate import (
    Admitted,
    OutboundGate,
    OutboundNotAdmitted,
    ProviderRequestRefused,
    gate_without_policy,
)
from apps.engine.providers.openai_provider import OpenAIWorker
from apps.engine.providers.request import ProviderRequest
from apps.engine.runner import run_request
from apps.engine.strategies import build_strategy
from apps.engine.types import WorkerInfo
from tests.fakes.base import FAKE_HOST
from tests.fakes.openai_server import FakeOpenAIServer
from tests.fixtures.api import PLAN_TEXT

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [
    p for d in ("apps", "conductor_web") for p in (ROOT / d).rglob("*.py") if "migrations" not in p.parts
]

# Modules that can open a connection or run a model, and the only places that may import them.
NETWORK_MODULES = ("openai", "anthropic", "httpx", "httpx2", "httpcore", "httpcore2", "llama_cpp", "requests",
                   "urllib3", "aiohttp", "urllib.request", "http.client", "mcp")  # fmt: skip
ALLOWED_IMPORTS = {
    ("apps/engine/providers/openai_provider.py", "openai"): "the OpenAI worker: sends only Admitted requests",
    ("apps/engine/providers/anthropic_provider.py", "anthropic"): "the Anthropic worker: same",
    (
        "apps/engine/providers/_egress_http.py",
        "httpx2",
    ): "the one HTTP client of both SDKs: refuses unadmitted sends",
    ("apps/engine/providers/_egress_http.py", "httpcore2"): "its connection pool (egress check at connect)",
    ("apps/engine/providers/local.py", "llama_cpp"): "the local worker: admits before generating",
    ("apps/insights/services.py", "httpx"): "budget-alert webhooks to an operator's URL: no model, no prompt",
    (
        "apps/audit/witnessing.py",
        "urllib.request",
    ): "checkpoints to the operator's configured witnesses (AUDIT_WITNESSES): tree heads, no content",
    # Issue 43: MCP tool servers are not model providers (no prompt leaves through them; a tool's
    # arguments pass the tool gate in apps.tools.calls first). Egress-checked at connect like providers.
    ("apps/api/mcp_endpoint.py", "mcp"): "the /mcp endpoint: an MCP *server* (opens no connection)",
    ("apps/engine/toolclient.py", "mcp"): "the MCP client of registered tool servers (docs/tools.md)",
    ("apps/engine/toolclient.py", "httpx2"): "its HTTP client: no proxy from the environment, no redirect",
    ("apps/engine/toolclient.py", "httpcore2"): "its connection pool (egress check at connect)",
}

# Calls that build something able to reach a provider: each must be given a gate.
CONSTRUCTORS = {"build_worker", "build_engine_worker", "build_engine_pool", "build_pool",
                "OpenAIWorker", "AnthropicWorker", "LocalWorker"}  # fmt: skip
# Internal plumbing only the provider modules may touch.
PLUMBING = {"shared_sdk_client", "shared_http_client", "build_client", "Llama", "create_chat_completion"}

# Every call of ``.complete(`` under apps/ (module, enclosing function) and why it is gated.
COMPLETE_CALLERS = {
    ("apps/engine/executor/attempt.py", "run_call"): "a worker step: pool worker built with the run's gate",
    (
        "apps/engine/tools_loop.py",
        "run_tool_loop",
    ): "a worker step's tool rounds (issue 43): the same pool worker, built with the run's gate",
    ("apps/engine/session.py", "call"): "the conductor's planning call (and JSON repair): same pool",
    ("apps/policies/guardrails/judge.py", "judge"): "a guardrail judge: a worker of the run's pool",
    (
        "apps/feedback/evaluators.py",
        "judge_score",
    ): "an evaluator's or an experiment's judge: pool built with the team's gate",
    (
        "apps/workers/services/health_check.py",
        "_probe",
    ): "a health check: worker built with the provider team's gate",
    (
        "apps/workers/connection.py",
        "_call",
    ): "Test connection on unsaved provider settings (issue 42): worker built with the team's gate",
    (
        "apps/runs/execution/strategies.py",
        "complete",
    ): "a replay: wraps a pool worker built with the run's gate",
    ("apps/runs/journal.py", "complete"): "the call journal: wraps a pool worker (replays send nothing)",
}


# Every call of ``.embed(`` under apps/ (issue 45) and why it is gated.
EMBED_CALLERS = {
    (
        "apps/api/v1/embeddings.py",
        "create_embeddings",
    ): "/v1/embeddings: the pool's default worker, built with the team's outbound gate",
}


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _trees() -> Iterator[tuple[str, ast.Module]]:
    for path in SOURCES:
        yield _rel(path), ast.parse(path.read_text(), filename=str(path))


def _callee(call: ast.Call) -> str | None:
    fn = call.func
    if isinstance(fn, ast.Name):
        return fn.id
    if isinstance(fn, ast.Attribute):
        return fn.attr
    return None


def _calls_with_scope(tree: ast.Module) -> Iterator[tuple[str, ast.Call]]:
    def walk(node: ast.AST, scope: str) -> Iterator[tuple[str, ast.Call]]:
        for child in ast.iter_child_nodes(node):
            inner = scope
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner = child.name
            elif isinstance(child, ast.Lambda):
                inner = "<lambda>"
            if isinstance(child, ast.Call):
                yield scope, child
            yield from walk(child, inner)

    yield from walk(tree, "<module>")


def test_only_the_provider_modules_import_an_sdk_or_http_client() -> None:
    found: set[tuple[str, str]] = set()
    for rel, tree in _trees():
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                for module in NETWORK_MODULES:
                    if name == module or name.startswith(module + "."):
                        found.add((rel, module))
    assert found == set(ALLOWED_IMPORTS), f"new network imports: {sorted(found - set(ALLOWED_IMPORTS))}"


def test_every_worker_constructor_call_passes_a_gate_and_none_the_policy_less_one() -> None:
    missing: list[str] = []
    plumbing: list[str] = []
    for rel, tree in _trees():
        for scope, call in _calls_with_scope(tree):
            name = _callee(call)
            where = f"{rel}:{call.lineno} ({scope})"
            if name in CONSTRUCTORS and not rel.startswith("apps/engine/providers/"):
                gate = next((k.value for k in call.keywords if k.arg == "gate"), None)
                if gate is None:
                    missing.append(f"{where}: {name}() without gate=")
                elif isinstance(gate, ast.Call) and _callee(gate) == "gate_without_policy":
                    missing.append(f"{where}: {name}() with the policy-less gate")
            if name == "gate_without_policy":
                missing.append(f"{where}: application code uses gate_without_policy()")
            if name in PLUMBING and not rel.startswith("apps/engine/providers/"):
                plumbing.append(where)
    assert not missing, "\n".join(missing)
    assert not plumbing, f"SDK plumbing outside the provider layer: {plumbing}"


@pytest.mark.parametrize(("method", "known"), [("complete", COMPLETE_CALLERS), ("embed", EMBED_CALLERS)])
def test_every_caller_of_a_worker_call_is_known(method: str, known: dict[tuple[str, str], str]) -> None:
    callers: set[tuple[str, str]] = set()
    for rel, tree in _trees():
        if rel.startswith("apps/engine/providers/"):
            continue  # the workers themselves
        for scope, call in _calls_with_scope(tree):
            if _callee(call) == method and isinstance(call.func, ast.Attribute):
                callers.add((rel, scope))
    assert callers == set(known), (
        f"unlisted: {sorted(callers - set(known))}; gone: {sorted(set(known) - callers)}"
    )


# --- the guards, at run time -------------------------------------------------------------------------


INFO = WorkerInfo("w", "W", "fake-solver-1", "openai_compatible", timeout_s=10)


def test_a_worker_cannot_be_built_without_a_gate() -> None:
    with pytest.raises(TypeError):
        build_worker(INFO, base_url="http://127.0.0.13:1/v1", api_key="k")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="OutboundGate"):
        OpenAIWorker(INFO, base_url="http://127.0.0.13:1/v1", api_key="k", gate=object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="OutboundPolicy"):
        OutboundGate(object())  # type: ignore[arg-type]


def test_an_admitted_request_cannot_be_forged() -> None:
    with pytest.raises(TypeError, match="admit"):
        Admitted(ProviderRequest(({"role": "user", "content": "hi"},)))
    with pytest.raises(TypeError, match="admit"):
        Admitted(ProviderRequest(({"role": "user", "content": "hi"},)), (), object())


def test_an_sdk_client_reached_around_the_gate_opens_no_socket(openai_fake: FakeOpenAIServer) -> None:
    egress = EgressPolicy.parse(FAKE_HOST)
    worker = build_worker(
        INFO, gate=gate_without_policy(), base_url=openai_fake.base_url, api_key="k", egress=egress
    )
    client = worker._client  # type: ignore[attr-defined]
    with pytest.raises(openai.APIConnectionError) as caught:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "around the gate"}])
    assert isinstance(caught.value.__cause__.__cause__, OutboundNotAdmitted)  # type: ignore[union-attr]
    assert openai_fake.requests == []  # nothing reached the socket
    assert worker.complete([{"role": "user", "content": "through the gate"}]).text == "ok"
    [request] = openai_fake.requests
    assert b"through the gate" in request.raw


def test_an_embeddings_client_reached_around_the_gate_opens_no_socket(openai_fake: FakeOpenAIServer) -> None:
    recorder = Recorder()
    egress = EgressPolicy.parse(FAKE_HOST)
    worker = build_worker(
        INFO, gate=OutboundGate(recorder), base_url=openai_fake.base_url, api_key="k", egress=egress
    )
    client = worker._client  # type: ignore[attr-defined]
    with pytest.raises(openai.APIConnectionError):
        client.embeddings.create(model="m", input=["around the gate"])
    assert openai_fake.requests == []
    result = worker.embed(["through the gate", "second"])  # type: ignore[attr-defined]
    assert len(result.vectors) == 2
    # Each input is its own field, read by the gate before the socket opened.
    assert [f.path for f in recorder.requests[0]] == ["input[0]", "input[1]"]
    [request] = openai_fake.requests
    assert b"through the gate" in request.raw


def test_an_unreadable_field_is_refused_naming_it(openai_fake: FakeOpenAIServer) -> None:
    egress = EgressPolicy.parse(FAKE_HOST)
    worker = build_worker(
        INFO, gate=gate_without_policy(), base_url=openai_fake.base_url, api_key="k", egress=egress
    )
    for messages, field in (
        ([{"role": "user", "content": b"bytes"}], "messages[0].content"),
        ([{"role": "user", "content": "hi", "audio": {"data": "..."}}], "messages[0].audio"),
        ([{"role": "robot", "content": "hi"}], "messages[0].role"),
    ):
        with pytest.raises(ProviderRequestRefused) as refused:
            worker.complete(messages)  # type: ignore[arg-type]
        assert refused.value.field == field
    assert openai_fake.requests == []


# --- the callers, at run time --------------------------------------------------------------------------


class Recorder:
    """An outbound policy that lets everything through and remembers every request it read."""

    def __init__(self) -> None:
        self.requests: list[list[OutboundField]] = []

    def check_outbound(self, fields: Sequence[OutboundField]) -> OutboundVerdict:
        self.requests.append(list(fields))
        return OutboundVerdict()

    def saw(self, text: str) -> bool:
        return any(text in f.text for fields in self.requests for f in fields)


@pytest.mark.django_db
def test_a_conductor_run_plans_and_steps_through_the_gate(fake_pool: Any) -> None:
    from apps.runs.integration import build_pool

    recorder = Recorder()
    fake_pool.server.responder = lambda req: PLAN_TEXT if req.get("model") == "fake-conductor-1" else "42"
    pool = build_pool(fake_pool.pool, gate=OutboundGate(recorder))
    result = run_request(
        run_id="gate-test",
        question="What is six times seven?",
        pool=pool,
        strategy=build_strategy("conductor", preset="mini"),
        sink=ListSink(),
    )
    assert result.status.value == "succeeded", result.error
    sent = fake_pool.server.chat_requests()
    assert len(sent) == 3  # the plan and two steps
    assert len(recorder.requests) == len(sent)  # each provider request was read by the gate first
    assert recorder.saw("What is six times seven?") and recorder.saw("Compute six times seven.")


@pytest.mark.django_db
def test_a_health_check_goes_through_the_gate(fake_pool: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from apps.workers import ports
    from apps.workers.services import worker_health_check

    recorder = Recorder()
    teams: list[Any] = []

    def gate_for(team: Any) -> OutboundGate:
        teams.append(team)
        return OutboundGate(recorder)

    monkeypatch.setattr(ports, "_outbound_gate", gate_for)
    result = worker_health_check(actor=None, worker=fake_pool.workers[0])
    assert result.status == "ok", result.detail
    assert teams == [fake_pool.provider.team]  # the provider's team's policy
    assert recorder.saw("Reply with the single word: OK")
    assert len(fake_pool.server.chat_requests()) == len(recorder.requests) == 1


@pytest.mark.django_db
def test_a_connection_test_goes_through_the_gate(
    fake_pool: Any, policy_admin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 42: "Test connection" before saving is a provider call like any other."""
    from apps.workers import ports
    from apps.workers.connection import provider_connection_test

    recorder = Recorder()
    teams: list[Any] = []

    def gate_for(team: Any) -> OutboundGate:
        teams.append(team)
        return OutboundGate(recorder)

    monkeypatch.setattr(ports, "_outbound_gate", gate_for)
    fake_pool.server.script("OK")
    result = provider_connection_test(
        actor=policy_admin,
        team=fake_pool.provider.team,
        kind="openai_compatible",
        base_url=fake_pool.base_url,
        api_key=fake_pool.api_key,
        model="fake-solver-1",
    )
    assert result.ok, result.detail
    assert teams == [fake_pool.provider.team]
    assert recorder.saw("Reply with the single word: OK")
    assert len(fake_pool.server.chat_requests()) == len(recorder.requests) == 1
