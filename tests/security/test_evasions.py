"""Detectors evaded by ordinary Unicode (issue 39, item 4): the evasion corpus at the provider.

``data/evasions.jsonl`` holds the variants (cards grouped with NBSP, U+202F, dots, zero-width
joiners, full-width or Arabic-Indic digits, split across messages; e-mails with a full-width at
sign or a Cyrillic letter; IBANs; secrets with a zero-width space or a Cyrillic dze inside
``sk-proj-``; ``insider-trading`` for a blocked ``insider trading``; injection phrases with
zero-width spaces, look-alike letters, in French, German, Spanish and Italian). Each goes through
the live daphne's ``/v1`` to the fake OpenAI provider on a real socket (model ``solo``: the chat
passes through as it is), under a policy that redacts personal data and secrets and blocks
injection and the term. A ``redact`` variant must reach the provider with the finding masked:
none of its ``needles`` in the bytes received, its placeholder there. A ``block`` variant must be
refused (400) with nothing of it sent.

One live server for the whole corpus: the variants run in one test, which reports every variant
that got through at once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.factories.api import make_api_key
from tests.factories.policies import publish_policy
from tests.fixtures.workers import solo_pool_of
from tests.security.outbound_helpers import leaked

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]

CORPUS = [
    json.loads(line) for line in (Path(__file__).parent / "data" / "evasions.jsonl").read_text().splitlines()
]
POLICY = {
    "guardrails": {
        "input": {
            "pii": {"enabled": True, "action": "redact", "types": ["card", "email", "iban"]},
            "secrets": {"enabled": True, "action": "redact"},
            "injection": {"enabled": True, "action": "block"},
            "blocked_terms": {
                "enabled": True,
                "action": "block",
                "terms": [{"pattern": "insider trading", "message": "No insider trading."}],
            },
        }
    }
}


def test_the_corpus_is_broad() -> None:
    kinds: dict[str, int] = {}
    for case in CORPUS:
        kinds[case["kind"]] = kinds.get(case["kind"], 0) + 1
    assert len(CORPUS) >= 60
    assert set(kinds) == {"card", "email", "iban", "secret", "term", "injection"}
    assert all(n >= 5 for n in kinds.values()), kinds
    assert len({c["id"] for c in CORPUS}) == len(CORPUS)


def test_every_evasion_is_redacted_or_blocked_at_the_provider(
    daphne_server: Any, runtime_workers: Any, fake_pool: Any, alpha: Any, team_admin: Any
) -> None:
    solo_pool_of(fake_pool, alpha)
    publish_policy(alpha, POLICY)
    key = make_api_key(
        alpha, name="evasions", principal=team_admin, requests_per_minute=1000, tokens_per_minute=1_000_000
    ).plaintext
    server = fake_pool.server
    got_through: list[str] = []
    with httpx.Client(
        base_url=f"{daphne_server.url}/v1", headers={"Authorization": f"Bearer {key}"}, timeout=90
    ) as client:
        for case in CORPUS:
            server.reset()
            messages = [{"role": "user", "content": text} for text in case["messages"]]
            resp = client.post("/chat/completions", json={"model": "solo", "messages": messages})
            received = server.received()
            if case["expect"] == "block":
                if resp.status_code != 400 or received:
                    got_through.append(
                        f"{case['id']}: HTTP {resp.status_code}, {len(server.requests)} provider call(s)"
                    )
                continue
            if resp.status_code != 200 or not received:
                got_through.append(f"{case['id']}: HTTP {resp.status_code}: {resp.text[:200]}")
                continue
            leaks = [n for n in case["needles"] if leaked(received, n)]
            if leaks or not leaked(received, case["placeholder"]):
                got_through.append(f"{case['id']}: reached the provider unmasked")
    assert not got_through, "evasions that got through:\n" + "\n".join(got_through)
