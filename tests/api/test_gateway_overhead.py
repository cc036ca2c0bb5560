"""Gateway behaviour of ``/v1`` (issue 15): the ``x-conductor-overhead-ms`` header and a one-worker
pool by slug as a pass-through. A live daphne and the real ``openai`` client against a loopback
fake provider; both modes."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from apps.runs.models import Run, RunEvent
from tests.fakes.base import FakeReply
from tests.fixtures.workers import solo_pool_of

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]

PROMPT = [
    {"role": "system", "content": "Answer tersely."},
    {"role": "user", "content": "What is six times seven?"},
]
# Every provider call of these tests takes at least this long, so the run's provider wait is
# known from below without measuring anything about this machine's speed.
PROVIDER_DELAY_S = 0.3


@pytest.fixture
def client(api_server: Any, runtime_workers: Any, api_key: tuple[Any, str]) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{api_server.url}/v1", api_key=api_key[1], max_retries=0, timeout=90)


@pytest.fixture
def solo_pool(fake_pool: Any, alpha: Any) -> Any:
    """A one-worker pool ``solo`` (the fake solver) whose provider is slow by PROVIDER_DELAY_S."""
    fake_pool.server.responder = lambda req: FakeReply("42", delay=PROVIDER_DELAY_S)
    return solo_pool_of(fake_pool, alpha)


def test_overhead_header_is_total_less_the_provider_wait(solo_pool: Any, fake_pool: Any, client: Any) -> None:
    raw = client.chat.completions.with_raw_response.create(model="solo", messages=PROMPT)
    assert raw.parse().choices[0].message.content == "42"
    run_id = raw.headers["x-conductor-run"]
    total_ms = float(raw.headers["openai-processing-ms"])
    overhead_ms = float(raw.headers["x-conductor-overhead-ms"])
    finished = RunEvent.objects.get(run_id=run_id, type="run.finished").data
    provider_ms = finished["provider_ms"]
    assert provider_ms >= PROVIDER_DELAY_S * 1000
    assert 0 <= overhead_ms <= total_ms - PROVIDER_DELAY_S * 1000
    # Both headers come from one elapsed time E: processing = floor(E), overhead = E - provider
    # rounded to 0.1 ms. So provider + overhead lies in [floor(E), floor(E) + 1) give or take that
    # rounding: arithmetic on the headers, no bound on this machine's speed.
    assert total_ms - 0.05 <= provider_ms + overhead_ms < total_ms + 1.05


def test_overhead_header_on_an_error_is_the_whole_time(client: Any) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="no-such-pool", messages=PROMPT)
    headers = caught.value.response.headers
    total_ms = float(headers["openai-processing-ms"])
    # No provider wait: the overhead is the same elapsed time, to 0.1 ms instead of floored to 1 ms.
    assert total_ms - 0.05 <= float(headers["x-conductor-overhead-ms"]) < total_ms + 1.05


def test_a_one_worker_pool_by_slug_passes_the_chat_through(
    solo_pool: Any, fake_pool: Any, client: Any
) -> None:
    before = len(fake_pool.server.chat_requests())
    raw = client.chat.completions.with_raw_response.create(model="solo", messages=PROMPT)
    assert raw.parse().choices[0].message.content == "42"
    sent = fake_pool.server.chat_requests()[before:]
    # No conductor call: one request, to the solver, with the client's chat as it was.
    assert [r.json.get("model") for r in sent] == ["fake-solver-1"]
    assert [{"role": m["role"], "content": m["content"]} for m in sent[0].messages] == PROMPT
    run = Run.objects.get(pk=raw.headers["x-conductor-run"])
    assert run.strategy == "single" and run.step_count == 1


def test_a_pool_of_several_workers_by_slug_still_runs_the_conductor(
    fake_pool: Any, client: Any, conductor_fake: Any
) -> None:
    before = len(fake_pool.server.chat_requests())
    raw = client.chat.completions.with_raw_response.create(model="fake", messages=PROMPT)
    raw.parse()
    models = [r.json.get("model") for r in fake_pool.server.chat_requests()[before:]]
    assert "fake-conductor-1" in models
    assert Run.objects.get(pk=raw.headers["x-conductor-run"]).strategy == "conductor"


@pytest.mark.parametrize(
    ("path", "body", "shape"),
    [
        ("/v1/chat/completions", {"model": "conductor-mini", "messages": PROMPT}, "openai"),
        ("/v1/responses", {"model": "conductor-mini", "input": "What is six times seven?"}, "openai"),
        (
            "/v1/messages",
            {"model": "conductor-mini", "max_tokens": 64, "messages": PROMPT[1:]},
            "anthropic",
        ),
    ],
)
def test_a_part_failing_before_the_run_exists_is_a_503_in_the_protocols_shape(
    path: str, body: dict[str, Any], shape: str, fake_pool: Any, api_key: tuple[Any, str], monkeypatch: Any
) -> None:
    """The database busy past its timeout while creating the run: every adapter answers 503 in
    its own error shape, naming the part, never an HTML 500; and no run row exists."""
    from django.db import OperationalError
    from django.test import Client

    import apps.runs.services as run_services

    def busy(**kwargs: Any) -> None:
        raise OperationalError("database is locked: secret-looking detail")

    monkeypatch.setattr(run_services, "run_create", busy)
    response = Client().post(
        path, body, content_type="application/json", headers={"authorization": f"Bearer {api_key[1]}"}
    )
    assert response.status_code == 503, response.content
    payload = response.json()
    error = payload["error"]
    if shape == "anthropic":
        assert payload["type"] == "error"
    else:
        assert error["type"] == "server_error"
    assert "the database failed (OperationalError)" in error["message"]
    assert "secret-looking" not in response.content.decode()
    assert not Run.objects.exists()
