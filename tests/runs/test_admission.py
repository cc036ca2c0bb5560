"""Admission, then creation (issue 41 item 4): ``admit_run`` checks and returns a frozen value that
``create_run`` stores; a trust claim is a proof about this very request, asserted, never a bare
flag (the refusals themselves: test_services.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from apps.api.v1.targets import resolve_model
from apps.audit.models import AuditEvent
from apps.runs.admission import AccessProof, AccessProofMismatch, Admission, RunRefused, admit_run
from apps.runs.models import Run, RunStatus
from apps.runs.services import create_run, run_create

pytestmark = pytest.mark.django_db


@pytest.fixture
def no_dispatch(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    sent: list[Any] = []
    monkeypatch.setattr(
        "apps.runs.execution.outbox.dispatch_run", lambda run_id, request_id="": sent.append(run_id)
    )
    return sent


def test_admission_reads_only_and_is_frozen(fake_pool: Any, owner: Any) -> None:
    admission = admit_run(actor=owner, pool=fake_pool.pool, question="  hi  ", strategy="moa")
    assert not Run.objects.exists() and not AuditEvent.objects.filter(event_type="run.created").exists()
    assert (admission.team.slug, admission.pool, admission.question, admission.preset) == (
        "alpha",
        fake_pool.pool,
        "hi",
        "",
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        admission.pool = None  # type: ignore[misc]


def test_creation_stores_the_admission(fake_pool: Any, owner: Any, no_dispatch: list[Any]) -> None:
    admission = admit_run(actor=owner, pool=fake_pool.pool, question="hi")
    run = create_run(admission)
    stored = Run.objects.get(pk=run.id)
    assert (stored.status, stored.team, stored.pool, stored.created_by) == (
        RunStatus.QUEUED,
        admission.team,
        fake_pool.pool,
        owner,
    )
    assert stored.policy_version_id == admission.policy.version_id


def test_creation_refuses_an_admission_admit_run_did_not_make(
    fake_pool: Any, owner: Any, outsider: Any
) -> None:
    admission = admit_run(actor=owner, pool=fake_pool.pool, question="hi")
    # Built by hand, or an admitted one with another actor swapped in: neither is stored.
    by_hand = Admission(
        **{f.name: getattr(admission, f.name) for f in dataclasses.fields(Admission) if f.init}
    )
    swapped = dataclasses.replace(admission, actor=outsider)
    for forged in (by_hand, swapped):
        with pytest.raises(AccessProofMismatch):
            create_run(forged)
    assert not Run.objects.exists()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"question": ""},
        {"question": "hi", "source": "carrier-pigeon"},
        {"question": "hi", "strategy": "bogus"},
        {"question": "hi", "replay_messages": []},
    ],
)
def test_admission_refuses_bad_input_before_any_read(
    fake_pool: Any, owner: Any, kwargs: dict[str, Any], django_assert_num_queries: Any
) -> None:
    with django_assert_num_queries(0), pytest.raises(RunRefused) as info:
        admit_run(actor=owner, pool=fake_pool.pool, **kwargs)
    assert info.value.code == "invalid"


def test_a_preset_only_the_conductor_uses_is_dropped_not_refused(fake_pool: Any, owner: Any) -> None:
    assert (
        admit_run(actor=owner, pool=fake_pool.pool, question="hi", strategy="single", preset="mega").preset
        == ""
    )


def test_admission_refuses_a_pool_the_actor_may_not_use(fake_pool: Any, outsider: Any, alpha: Any) -> None:
    with pytest.raises(RunRefused) as info:
        admit_run(actor=outsider, team=alpha, pool=fake_pool.pool, question="hi")
    assert info.value.code == "pool_not_allowed"
    assert AuditEvent.objects.filter(event_type="run.refused", actor=outsider).exists()


def _proof(actor: Any, team: Any, pool: Any, **changes: Any) -> AccessProof:
    proof = AccessProof(
        actor_id=actor.pk,
        team_id=team.pk,
        pool_id=pool.pk,
        access_stamp=None,
        team=True,
        pool=True,
        by="test",
    )
    return dataclasses.replace(proof, **changes)


def test_a_matching_proof_stands_for_the_checks_it_vouches_for(
    fake_pool: Any, owner: Any, alpha: Any
) -> None:
    admission = admit_run(
        actor=owner,
        team=alpha,
        pool=fake_pool.pool,
        question="hi",
        proof=_proof(owner, alpha, fake_pool.pool),
    )
    assert admission.team == alpha and admission.pool == fake_pool.pool


@pytest.mark.parametrize(
    "changes",
    [{"actor_id": -1}, {"team_id": -1}, {"pool_id": -1}, {"access_stamp": 12345}],
    ids=["another actor", "another team", "another pool", "another access version"],
)
def test_a_proof_about_another_request_raises(
    fake_pool: Any, owner: Any, outsider: Any, alpha: Any, changes: dict[str, Any]
) -> None:
    # The outsider would be refused; a proof about someone or something else must not let them in.
    proof = _proof(outsider, alpha, fake_pool.pool, **changes)
    with pytest.raises(AccessProofMismatch):
        admit_run(actor=outsider, team=alpha, pool=fake_pool.pool, question="hi", proof=proof)
    assert not Run.objects.exists()


def test_a_pool_proof_needs_the_pool_it_is_about(fake_pool: Any, owner: Any, alpha: Any) -> None:
    with pytest.raises(AccessProofMismatch):  # no pool asked for: the default cannot be vouched for
        admit_run(actor=owner, team=alpha, question="hi", proof=_proof(owner, alpha, fake_pool.pool))


def test_the_v1_flags_are_a_proof_of_the_keys_verdict(
    fake_pool: Any, api_key: tuple[Any, str], owner: Any, no_dispatch: list[Any]
) -> None:
    key = api_key[0]
    target = resolve_model(key, fake_pool.pool.slug)
    flags = {"pool_allowed": True, "team_allowed": target.team_allowed, "api_key": key}
    run = run_create(actor=key.created_by, team=key.team, pool=target.pool, question="hi", **flags)
    assert Run.objects.get(pk=run.id).created_by == key.created_by
    # The same verdict for another actor, or a pool row resolve_model did not vouch for: raised.
    with pytest.raises(AccessProofMismatch):
        run_create(actor=owner, team=key.team, pool=target.pool, question="hi", **flags)
    with pytest.raises(AccessProofMismatch):
        run_create(actor=key.created_by, team=key.team, pool=fake_pool.pool, question="hi", **flags)
    target.pool.key_may_use = False
    with pytest.raises(AccessProofMismatch):
        run_create(actor=key.created_by, team=key.team, pool=target.pool, question="hi", **flags)
    assert Run.objects.count() == 1


def test_trust_flags_without_the_key_they_vouch_for_raise(fake_pool: Any, owner: Any, alpha: Any) -> None:
    for flag in ("pool_allowed", "team_allowed"):
        with pytest.raises(AccessProofMismatch):
            run_create(actor=owner, team=alpha, pool=fake_pool.pool, question="hi", **{flag: True})
    assert not Run.objects.exists()


def test_execute_here_is_asserted_against_the_inline_setting(
    fake_pool: Any, owner: Any, alpha: Any, settings: Any
) -> None:
    settings.V1_INLINE_RUNS = "off"
    with pytest.raises(AccessProofMismatch):
        admit_run(actor=owner, team=alpha, pool=fake_pool.pool, question="hi", execute_here=True)
