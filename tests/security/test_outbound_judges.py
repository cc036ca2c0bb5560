"""Judges, evaluators and experiments call providers too (issue 39, items 1 and 3).

Against the live daphne (and, in distributed mode, a Celery worker) with the fake OpenAI provider
on a real socket recording the exact bytes it receives. The team's input policy redacts cards and
e-mail addresses:

- item 1: a member's question ``my card 4111 1111 1111 1111 and mail bob.smith@example.com``
  reaches the run's worker masked — and now the judge evaluator's model, the guardrail judge's
  model and an experiment's judge too (they used to get ``run.question`` / the answer as is);
- item 3: an experiment whose every answer is held for review scores nothing (a member read a
  held answer one guess per dataset row: 100 % vs 0 % on two datasets differing only in the
  reference); the rows say ``held``, evaluators audit that they skipped; once a reviewer releases
  the answer, the experiment scores it.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest
from django.test import Client

from apps.audit.models import AuditEvent
from apps.experiments import selectors, services
from apps.experiments.models import Dataset, Experiment, ExperimentRun
from apps.feedback.models import Evaluator, Feedback, Metric
from apps.runs.models import Run
from apps.runs.reviews import run_review
from tests.factories.api import make_api_key
from tests.factories.policies import publish_policy
from tests.fakes.base import FakeReply
from tests.fixtures.waits import wait_runs, wait_until
from tests.fixtures.workers import solo_pool_of
from tests.security.outbound_helpers import CARD, EMAIL, card_leaked, leaked

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]

QUESTION = f"my card {CARD} and mail {EMAIL}"
REDACT = {"pii": {"enabled": True, "action": "redact", "types": ["card", "email"]}}
RUBRIC = "Grade the answer."


def _no_pii(received: bytes) -> None:
    assert received, "the provider was called"
    assert not card_leaked(received), "the provider received the card"
    assert not leaked(received, EMAIL), "the provider received the e-mail address"


def _judge_evaluator(alpha: Any, worker: str) -> None:
    quality = Metric.objects.create(team=alpha, name="quality", kind="float")
    Evaluator.objects.create(
        team=alpha, name="grader", metric=quality, kind="judge", config={"rubric": RUBRIC, "worker": worker}
    )


def _v1(daphne_server: Any, alpha: Any, team_admin: Any, body: dict[str, Any]) -> httpx.Response:
    key = make_api_key(alpha, name="judges", principal=team_admin).plaintext
    return httpx.post(
        f"{daphne_server.url}/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=90,
    )


def test_a_judge_evaluator_gets_the_question_as_the_workers_do(
    daphne_server: Any, runtime_workers: Any, fake_pool: Any, alpha: Any, team_admin: Any
) -> None:
    solo_pool_of(fake_pool, alpha)
    publish_policy(alpha, {"guardrails": {"input": REDACT}})
    _judge_evaluator(alpha, "fake-solver")
    fake_pool.server.responder = lambda req: FakeReply("Noted. SCORE: 0.8")
    resp = _v1(
        daphne_server,
        alpha,
        team_admin,
        {"model": "solo", "messages": [{"role": "user", "content": QUESTION}]},
    )
    assert resp.status_code == 200, resp.text
    run = Run.objects.get(pk=resp.json()["conductor"]["run_id"])
    # The evaluator runs after the run's last commit (in the executing process): wait for its row.
    wait_until(lambda: Feedback.objects.filter(run=run, source="evaluator").exists(), 60, "the judge's score")
    judged = [r for r in fake_pool.server.requests if RUBRIC.encode() in r.raw]
    assert judged, "the judge was asked"
    _no_pii(fake_pool.server.received())
    assert b"[REDACTED:card]" in judged[-1].raw and b"[REDACTED:email]" in judged[-1].raw
    # What the gate did to the judge's request is on the run's record: field and rule, no content.
    rows = AuditEvent.objects.filter(run_id=run.pk, event_type="outbound.checked")
    assert rows.exists()
    payload = json.dumps([r.payload for r in rows])
    assert "guardrails.input.pii" in payload and "messages[1].content" in payload
    assert CARD not in payload and EMAIL not in payload


def test_a_guardrail_judge_gets_the_answer_with_the_input_policy_applied(
    daphne_server: Any, runtime_workers: Any, fake_pool: Any, alpha: Any, team_admin: Any
) -> None:
    """The answer holds a card; the output stage has a model judge and no PII check of its own.
    The judge is a provider call: the input policy masks the card before the judge model sees it."""
    solo_pool_of(fake_pool, alpha)
    judge = {"name": "tone", "worker": "fake-solver", "prompt": "The answer is polite."}
    publish_policy(
        alpha,
        {
            "guardrails": {
                "input": REDACT,
                "output": {"model_judge": {"enabled": True, "action": "block", "judges": [judge]}},
            }
        },
    )

    def respond(req: dict[str, Any]) -> FakeReply:
        text = json.dumps(req.get("messages"))
        if "compliance judge" in text:
            return FakeReply('{"verdict": "pass", "reason": "polite"}')
        return FakeReply(f"Your card {CARD} is noted.")

    fake_pool.server.responder = respond
    resp = _v1(
        daphne_server,
        alpha,
        team_admin,
        {"model": "solo", "messages": [{"role": "user", "content": "Note my card."}]},
    )
    assert resp.status_code == 200, resp.text
    judged = [r for r in fake_pool.server.requests if b"compliance judge" in r.raw]
    assert judged, "the judge was asked"
    assert not card_leaked(b"\n".join(r.raw for r in judged)), "the judge model received the card"
    assert b"[REDACTED:card]" in judged[-1].raw
    run = Run.objects.get(pk=resp.json()["conductor"]["run_id"])
    checked = AuditEvent.objects.filter(run_id=run.pk, event_type="run.output_checked")
    payload = json.dumps([r.payload for r in checked])
    assert '"stage": "outbound"' in payload and "guardrails.input.pii" in payload and CARD not in payload


# --- experiments ------------------------------------------------------------------------------------


def _live_client(daphne_server: Any, user: Any) -> httpx.Client:
    """An httpx client on the live server, logged in as ``user`` (a session made in the test DB)."""
    django_client = Client()
    django_client.force_login(user)
    client = httpx.Client(base_url=daphne_server.url, timeout=90, follow_redirects=False)
    client.cookies.set("sessionid", django_client.cookies["sessionid"].value)
    page = client.get("/experiments/")
    assert page.status_code == 200
    match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    assert match is not None
    client.headers["X-CSRFToken"] = match.group(1)
    return client


def _start(
    client: httpx.Client,
    lines: list[dict[str, Any]],
    name: str,
    evaluator: str = "exact",
    extra: dict[str, Any] | None = None,
) -> Experiment:
    data = "\n".join(json.dumps(line) for line in lines).encode()
    up = client.post(
        "/experiments/datasets/",
        data={"team": "alpha", "name": name},
        files={"file": ("set.jsonl", data, "application/jsonl")},
    )
    assert up.status_code == 302, up.text[:2000]
    dataset = Dataset.objects.get(name=name)
    page = client.post(
        "/experiments/",
        data={
            "dataset": dataset.pk,
            "pool": "fake",
            "arms": ["single:fake-solver"],
            "evaluator": evaluator,
            "seed": 1,
            **(extra or {}),
        },
    )
    assert page.status_code == 302, page.text[:2000]
    return Experiment.objects.get(dataset=dataset)


def _finish(experiment: Experiment, server: Any, viewer: Any) -> Experiment:
    """The experiment once its one run ended (its events reach the test over the live server's
    websocket: the run executes in the server's process or a Celery worker), then refreshed."""
    [run_id] = ExperimentRun.objects.filter(experiment=experiment).values_list("run_id", flat=True)
    [run] = wait_runs([run_id], timeout=90, server=server, viewer=viewer)
    assert run.is_terminal, f"the experiment's run is still {run.status}"
    services.experiment_refresh(experiment)
    experiment.refresh_from_db()
    return experiment


def test_an_experiment_sends_its_judge_nothing_the_policy_masks(
    daphne_server: Any, runtime_workers: Any, fake_pool: Any, alpha: Any, owner: Any
) -> None:
    publish_policy(alpha, {"guardrails": {"input": REDACT}})
    _judge_evaluator(alpha, "fake-critic")
    fake_pool.server.responder = lambda req: FakeReply("Noted. SCORE: 1")
    client = _live_client(daphne_server, owner)
    experiment = _finish(
        _start(client, [{"input": QUESTION, "reference": f"write to {EMAIL}"}], "pii-set"),
        daphne_server,
        owner,
    )
    [row] = ExperimentRun.objects.filter(experiment=experiment)
    wait_until(
        lambda: Feedback.objects.filter(run_id=row.run_id, source="evaluator").exists(), 60, "the judge"
    )
    assert any(RUBRIC.encode() in r.raw for r in fake_pool.server.requests), "the judge was asked"
    _no_pii(fake_pool.server.received())


JUDGE_SCORER = {"judge": "fake/fake-critic", "rubric": RUBRIC}


def test_the_experiment_judge_scorer_passes_the_outbound_gate(
    daphne_server: Any, runtime_workers: Any, fake_pool: Any, alpha: Any, owner: Any
) -> None:
    """Issue 42: the LLM-as-judge scorer of an experiment sends its judge the question, answer and
    reference as the policy lets them out (masked), audited as the experiment judge's call."""
    publish_policy(alpha, {"guardrails": {"input": REDACT}})
    fake_pool.server.responder = lambda req: FakeReply(f"Mail {EMAIL}. SCORE: 0.6")
    client = _live_client(daphne_server, owner)
    experiment = _start(
        client, [{"input": QUESTION, "reference": f"write to {EMAIL}"}], "judge-set", "judge", JUDGE_SCORER
    )
    experiment = _finish(experiment, daphne_server, owner)
    [row] = ExperimentRun.objects.filter(experiment=experiment)
    wait_until(lambda: ExperimentRun.objects.get(pk=row.pk).score is not None, 60, "the judge's score")
    row.refresh_from_db()
    assert (row.score, row.score_note) == (0.6, "judge score 0.6")
    judged = [r for r in fake_pool.server.requests if RUBRIC.encode() in r.raw]
    assert len(judged) == 1 and (judged[0].json or {})["model"] == "fake-critic-1"
    _no_pii(fake_pool.server.received())
    audited = AuditEvent.objects.filter(event_type="outbound.checked", run_id=row.run_id)
    assert any(e.payload.get("purpose") == "experiment judge" for e in audited)


def test_the_experiment_judge_is_never_sent_a_held_answer(
    daphne_server: Any, runtime_workers: Any, fake_pool: Any, alpha: Any, owner: Any
) -> None:
    publish_policy(
        alpha,
        {"guardrails": {"output": {"length": {"enabled": True, "action": "require_review", "max_chars": 5}}}},
    )
    fake_pool.server.responder = lambda req: FakeReply("The secret plan is Bluebird. SCORE: 1")
    client = _live_client(daphne_server, owner)
    experiment = _start(client, [{"input": "What is the plan?"}], "judge-held", "judge", JUDGE_SCORER)
    experiment = _finish(experiment, daphne_server, owner)
    [row] = ExperimentRun.objects.filter(experiment=experiment)
    assert row.status == "held" and row.score is None
    assert not any(RUBRIC.encode() in r.raw for r in fake_pool.server.requests), "the judge saw a held answer"
    page = client.get(f"/experiments/{experiment.pk}/questions/1/")
    assert "The answer is held for review" in page.text and "Bluebird" not in page.text


def test_held_answers_are_not_scored_until_released(
    daphne_server: Any, runtime_workers: Any, fake_pool: Any, alpha: Any, owner: Any, reviewer: Any
) -> None:
    """Two datasets differing only in the reference: with the answers held, neither is scored (no
    100 % vs 0 % to read the held answer from); released, they are."""
    publish_policy(
        alpha,
        {"guardrails": {"output": {"length": {"enabled": True, "action": "require_review", "max_chars": 5}}}},
    )
    quality = Metric.objects.create(team=alpha, name="right", kind="boolean")
    Evaluator.objects.create(team=alpha, name="exact", metric=quality, kind="exact_match", config={})
    fake_pool.server.responder = lambda req: FakeReply("The secret plan is Bluebird.")
    client = _live_client(daphne_server, owner)
    ask = "What is the plan?"
    right = _start(client, [{"input": ask, "reference": ".*Bluebird.*"}], "guess-1", "regex")
    right = _finish(right, daphne_server, owner)
    wrong = _start(client, [{"input": ask, "reference": ".*Redwing.*"}], "guess-2", "regex")
    wrong = _finish(wrong, daphne_server, owner)
    for experiment in (right, wrong):
        [row] = ExperimentRun.objects.filter(experiment=experiment)
        assert row.run is not None and row.run.answer_held
        assert row.status == "held" and row.score is None
        [arm] = selectors.results(experiment)["table"]
        assert arm["accuracy"] is None and arm["held"] == 1
        page = client.get(f"/experiments/{experiment.pk}/")
        assert "held for review: not scored" in page.text
        assert "Bluebird" not in page.text
        # The team's evaluators skipped the held run and said so on its record.
        wait_until(
            lambda row=row: AuditEvent.objects.filter(
                run_id=row.run_id, event_type="feedback.evaluation_skipped"
            ).exists(),
            60,
            "the evaluators' skip record",
        )
        assert not Feedback.objects.filter(run_id=row.run_id, source="evaluator").exists()

    # A reviewer releases the answers: now they may be scored.
    for experiment in (right, wrong):
        row = ExperimentRun.objects.get(experiment=experiment)
        run_review(actor=reviewer, run=row.run, status="approved")
        services.experiment_refresh(experiment)
    assert ExperimentRun.objects.get(experiment=right).score == 1.0
    assert ExperimentRun.objects.get(experiment=wrong).score == 0.0
