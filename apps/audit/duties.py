"""Separation of duties for releasing held answers (issue 39, item 7).

A ``require_review`` guardrail holds an answer until someone *else* looks at it: nobody releases
the answer to their own question, whatever their role (a team admin, a reviewer of the team, a
platform administrator), as nobody approves their own held plan (``apps.runs.approvals``). The
person who asked is the run's ``created_by`` (for ``/v1`` and REST, the API key's creator).

The rule is checked by ``apps.audit.services.run_review`` and ``run_review_bulk``, which every
surface calls (the run page, the review desk and its bulk sign-off, ``POST /api/runs/<id>/review/``),
on the run row locked for the decision. A refusal raises :class:`ReleaseRefused` (a 403 naming the
rule) and is audited as ``run.release_refused``. Flagging or "needs follow-up" releases nothing and
stays open to the person who asked, as does signing off a run whose answer is not held.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied

from apps.audit.ports import AuditedRun
from apps.core.types import Actor

SEPARATION_OF_DUTIES = "separation_of_duties"
REFUSAL = (
    "Separation of duties (rule separation_of_duties): you asked this run's question, so another "
    "reviewer must release its held answer."
)


class ReleaseRefused(PermissionDenied):
    """An approval that would release a held answer to the person who asked for it."""

    rule = SEPARATION_OF_DUTIES

    def __init__(self, runs: list[Any], message: str = REFUSAL) -> None:
        super().__init__(message)
        self.runs = runs


def asked_by(actor: Actor, run: AuditedRun) -> bool:
    pk = getattr(actor, "pk", None)
    return pk is not None and run.created_by_id is not None and run.created_by_id == pk


def would_release_own(actor: Actor, run: AuditedRun, status: str, approved: str) -> bool:
    """Whether deciding ``status`` on ``run`` (as read now) releases the answer to ``actor``'s own
    question. ``approved``: the decision that releases (``ReviewDecision.APPROVED``)."""
    return status == approved and bool(run.answer_held) and asked_by(actor, run)
