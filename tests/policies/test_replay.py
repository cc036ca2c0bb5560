"""Policy replay (what-if): a draft's guardrails and constraints over what the team's past runs
stored, compared with the policy in force; retention-erased runs are named, held content never
reaches a policy admin who may not review the run."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from apps.policies.dry_run import RecordedRun, replay_runs
from apps.policies.services import effective_policy
from apps.policies.spec import EffectivePolicy, merge_specs, parse_spec
from apps.policies.views import recorded_runs
from apps.runs.retention import run_payload_erase
from tests.factories.policies import publish_policy
from tests.factories.runs import RunEventFactory, RunFactory, StepFactory

pytestmark = pytest.mark.django_db

URL = "/policies/team/alpha/"
EMAIL = "dana.scully@example.org"
SECRET_ANSWER = "Use key AKIAIOSFODNN7EXAMPLE for the bucket."


def _run(team: Any, pool: Any, *, question: str, answer: str = "Fine.", steps: int = 1, **kw: Any) -> Any:
    run = RunFactory(team=team, pool=pool, question=question, answer=answer, status="succeeded", **kw)
    keys = ["fake-planner", "fake-solver", "fake-critic"]
    plan = {
        "steps": [
            {"index": i, "worker": i % 3, "worker_key": keys[i % 3], "instruction": f"Part {i}", "access": []}
            for i in range(steps)
        ]
    }
    RunEventFactory(run=run, seq=1, type="plan.proposed", data={"round": 1, "attempt": 1, "plan": plan})
    for i in range(steps):
        StepFactory(run=run, index=i, worker_key=keys[i % 3], output=f"step {i} done")
    return run


def _draft(team: Any, spec: dict[str, Any]) -> EffectivePolicy:
    platform = effective_policy(None).spec
    return EffectivePolicy(merge_specs(platform, parse_spec(spec)), team_id=team.pk)


@pytest.fixture
def history(alpha: Any, beta: Any, fake_pool: Any) -> dict[str, Any]:
    pool = fake_pool.pool
    runs = {
        "email": _run(alpha, pool, question=f"Write to {EMAIL} about the invoice"),
        "secret": _run(alpha, pool, question="How do I read the bucket?", answer=SECRET_ANSWER),
        "long_plan": _run(alpha, pool, question="Plan a trip", steps=3),
        "plain": _run(alpha, pool, question="What is 2+2?"),
        "beta": _run(beta, pool, question=f"beta asks {EMAIL}"),
    }
    erased = _run(alpha, pool, question="Old question")
    run_payload_erase(run=erased, retention_days=30)
    runs["erased"] = erased
    return runs


def _replay(user: Any, team: Any, spec: dict[str, Any], limit: int = 50) -> Any:
    return replay_runs(
        current=effective_policy(team),
        draft=_draft(team, spec),
        runs=recorded_runs(user=user, team=team, limit=limit),
    )


def test_draft_guardrails_and_constraints_show_what_would_change(
    history: dict[str, Any], team_admin: Any, alpha: Any
) -> None:
    spec = {
        "constraints": {"max_steps": {"value": 2, "action": "repair"}},
        "guardrails": {
            "input": {"pii": {"enabled": True, "action": "redact", "types": ["email"]}},
            "output": {"secrets": {"enabled": True, "action": "block"}},
        },
    }
    report = _replay(team_admin, alpha, spec)
    assert report.considered == 5  # beta's run is not alpha's; the erased one is counted
    assert report.replayed == 4 and report.unchanged == 1
    assert report.newly["redacted"] == 1 and report.newly["blocked"] == 1 and report.newly["repaired"] == 1
    by_run = {d.run.run_id: d for d in report.changed}
    email = by_run[str(history["email"].pk)]
    assert email.after == ["redacted"] and email.before == []
    assert email.snippet is not None and EMAIL not in email.snippet and "invoice" in email.snippet
    secret = by_run[str(history["secret"].pk)]
    assert secret.after == ["blocked"] and secret.reasons[0].rule == "output:secrets"
    plan = by_run[str(history["long_plan"].pk)]
    assert plan.after == ["repaired"] and plan.reasons[0].rule == "plan:too_many_steps"
    ((skipped, why),) = report.not_replayable
    assert skipped.run_id == str(history["erased"].pk) and "retention erased" in why


def test_replay_compares_with_the_policy_in_force(
    history: dict[str, Any], team_admin: Any, alpha: Any
) -> None:
    publish_policy(alpha, {"guardrails": {"input": {"pii": {"enabled": True, "action": "redact"}}}})
    # The same check, now holding for review instead of redacting: held is new, redacted goes.
    report = _replay(
        team_admin, alpha, {"guardrails": {"input": {"pii": {"enabled": True, "action": "require_review"}}}}
    )
    assert report.newly["held"] == 1 and report.no_longer["redacted"] == 1
    assert report.newly["blocked"] == 0
    # The same policy as in force changes nothing.
    same = _replay(
        team_admin, alpha, {"guardrails": {"input": {"pii": {"enabled": True, "action": "redact"}}}}
    )
    assert same.changed == [] and same.unchanged == same.replayed == 4


def test_limit_takes_the_latest_runs(history: dict[str, Any], team_admin: Any, alpha: Any) -> None:
    from apps.runs.models import Run

    Run.objects.filter(pk=history["plain"].pk).update(created_at=timezone.now() + timedelta(minutes=5))
    (only,) = recorded_runs(user=team_admin, team=alpha, limit=1)
    assert only.run_id == str(history["plain"].pk)


def test_held_content_never_reaches_a_policy_admin_who_may_not_review(
    alpha: Any, fake_pool: Any, policy_admin: Any, team_admin: Any
) -> None:
    held = _run(
        alpha, fake_pool.pool, question=f"Mail {EMAIL} the plan", answer=SECRET_ANSWER, answer_held=True
    )
    spec = {"guardrails": {"output": {"secrets": {"enabled": True, "action": "block"}}}}
    (rec,) = recorded_runs(user=policy_admin, team=alpha, limit=10)
    assert rec.content_visible is False
    c = Client()
    c.force_login(policy_admin)
    html = _post_replay(c, spec)
    example = html.split(f'data-run="{held.pk}"')[1].split("</li>\n  \n  </ul>")[0]
    assert "output:secrets" in example and "blocked" in example  # the rule and its effect
    assert 'data-testid="withheld"' in example
    assert "AKIAIOSFODNN7EXAMPLE" not in html and "AWS access key" not in html and EMAIL not in html
    assert "the bucket" not in html and "Mail " not in html
    # A reviewer of the team sees the example with its detail and the (redacted) request.
    c.force_login(team_admin)
    html = _post_replay(c, spec)
    assert "AWS access key" in html and "Mail " in html and "AKIAIOSFODNN7EXAMPLE" not in html


def _post_replay(c: Client, spec: dict[str, Any]) -> str:
    import json

    resp = c.post(URL, {"spec": json.dumps(spec), "action": "replay", "replay_count": "20"})
    assert resp.status_code == 200
    html = resp.content.decode()
    assert 'data-testid="replay-result"' in html
    return html


def test_replay_page_counts_and_examples(history: dict[str, Any], team_admin: Any) -> None:
    c = Client()
    c.force_login(team_admin)
    html = _post_replay(c, {"guardrails": {"input": {"pii": {"enabled": True, "action": "redact"}}}})
    assert 'data-testid="newly-redacted">1<' in html and 'data-testid="newly-blocked">0<' in html
    assert "could not be replayed" in html and "retention erased its content" in html
    assert str(history["beta"].pk) not in html  # another team's run is never replayed here
    assert EMAIL not in html and "[REDACTED" in html


def test_model_judges_and_workers_gone_are_named_not_guessed(alpha: Any, fake_pool: Any) -> None:
    rec = RecordedRun(
        run_id="r1",
        created_at=timezone.now(),
        status="succeeded",
        question="hello",
        answer="hi",
        plans=(
            (
                1,
                {
                    "steps": [
                        {"index": 0, "worker": 0, "worker_key": "retired", "instruction": "x", "access": []}
                    ]
                },
            ),
        ),
        infos=(),
    )
    judge = {"enabled": True, "judges": [{"name": "tone", "worker": "fake-critic", "prompt": "Be kind."}]}
    draft = _draft(
        alpha,
        {
            "constraints": {"max_steps": {"value": 1, "action": "block"}},
            "guardrails": {"output": {"model_judge": judge}},
        },
    )
    report = replay_runs(current=effective_policy(alpha), draft=draft, runs=[rec])
    assert any("Model-judged checks (output) are not replayed" in n for n in report.notes)
    assert report.unchanged == 1  # the plan could not be mapped: not reported as passing or blocked
    from apps.policies.dry_run import replay_one

    assert any("'retired' is no longer in the pool" in n for n in replay_one(draft, rec).notes)


def test_outsider_cannot_replay_alpha(history: dict[str, Any], outsider: Any) -> None:
    c = Client()
    c.force_login(outsider)
    assert c.post(URL, {"spec": "{}", "action": "replay"}).status_code == 404


def test_replay_says_forecasts_are_not_replayed(history: dict[str, Any], team_admin: Any, alpha: Any) -> None:
    # Issue 42: "5 replayed, 5 unchanged" must not read as "the forecast limit is safe".
    spec = {"constraints": {"forecast": {"enabled": True, "max_tokens": 100, "action": "require_approval"}}}
    report = _replay(team_admin, alpha, spec)
    assert any("constraints.forecast" in note and "not replayed" in note for note in report.notes)
    assert not any("constraints.forecast" in note for note in _replay(team_admin, alpha, {}).notes)
