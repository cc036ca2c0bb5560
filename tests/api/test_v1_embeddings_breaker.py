"""``/v1/embeddings`` feeds the worker's circuit breaker as a run's calls do (issue 44/45).

A failing embeddings upstream opens the breaker after ``CIRCUIT_FAILURES`` down-failures; the next
embeddings call to that worker is refused without calling it (503 ``circuit_open`` naming the
worker). The breaker is the one a run's steps read (``apps.workers.health``).
"""

from __future__ import annotations

from typing import Any

import openai
import pytest
from django.conf import settings

from apps.audit.models import AuditEvent
from apps.workers.models import BreakerState, Pool, WorkerBreaker
from tests.factories.api import make_api_key
from tests.fakes.openai_server import openai_error

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def sdk(daphne_server: Any, runtime_workers: Any, alpha: Any, team_admin: Any) -> openai.OpenAI:
    key = make_api_key(
        alpha, name="breaker", principal=team_admin, requests_per_minute=1000, tokens_per_minute=1_000_000
    ).plaintext
    return openai.OpenAI(base_url=f"{daphne_server.url}/v1", api_key=key, max_retries=0, timeout=90)


def test_failing_embeddings_open_the_breaker_and_a_later_call_is_refused_naming_it(
    fake_pool: Any, embed_pool: Pool, sdk: openai.OpenAI
) -> None:
    sdk.embeddings.create(model="embed", input="warm up")  # answered: recorded as a success
    threshold = int(settings.CIRCUIT_FAILURES)
    # Every provider request fails from here (the provider's own retries included).
    fake_pool.server.script(*[openai_error("server_error") for _ in range(threshold * 10)])
    failures = 0
    refused: openai.APIStatusError | None = None
    for _ in range(threshold + 1):
        try:
            sdk.embeddings.create(model="embed", input="hello")
        except openai.APIStatusError as err:
            if err.body and err.body.get("code") == "circuit_open":
                refused = err
                break
            assert err.status_code == 502  # the provider's failure, named
            failures += 1
    assert failures == threshold  # opened by exactly the threshold of down-failures
    assert refused is not None and refused.status_code == 503
    assert "fake-embedder" in refused.body["message"] and "circuit" in refused.body["message"]
    breaker = WorkerBreaker.objects.get(worker__slug="fake-embedder")
    assert breaker.state == BreakerState.OPEN and breaker.consecutive_failures == threshold

    # Still open: refused again, and the provider is not called for it.
    sent = len(fake_pool.server.embedding_requests())
    with pytest.raises(openai.APIStatusError) as again:
        sdk.embeddings.create(model="embed", input="once more")
    assert again.value.status_code == 503 and again.value.body["code"] == "circuit_open"
    assert len(fake_pool.server.embedding_requests()) == sent
    row = AuditEvent.objects.filter(event_type="embedding.refused").latest("created_at")
    assert row.payload["refusal"] == {"provider_error": "circuit_open"}


def test_a_policy_refusal_says_nothing_about_the_provider(
    fake_pool: Any, embed_pool: Pool, sdk: openai.OpenAI, alpha: Any
) -> None:
    from tests.factories.policies import publish_policy

    terms = {"enabled": True, "action": "block", "terms": [{"pattern": "insider trading"}]}
    publish_policy(alpha, {"guardrails": {"input": {"blocked_terms": terms}}})
    for _ in range(int(settings.CIRCUIT_FAILURES) + 1):
        with pytest.raises(openai.BadRequestError):
            sdk.embeddings.create(model="embed", input="a memo on insider trading")
    assert not WorkerBreaker.objects.filter(worker__slug="fake-embedder", state=BreakerState.OPEN).exists()
    assert sdk.embeddings.create(model="embed", input="fine").data
