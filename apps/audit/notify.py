"""Tell a team's reviewers that a run entered their review queue (``REVIEW_NOTIFY_EMAIL``).

Sent after commit through Django's mail backend; the mail names the run, team and reason and links
to the queue, never the question or answer (held content stays behind the review permission).
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.mail import send_mail
from django.urls import reverse

from apps.audit.ports import AuditedRun

logger = logging.getLogger(__name__)


def team_reviewer_emails(team: Any) -> list[str]:
    """Addresses of active users holding ``review_team_runs`` on ``team`` (directly or by role group)."""
    from guardian.shortcuts import get_users_with_perms

    users: Any = get_users_with_perms(
        team, only_with_perms_in=["review_team_runs"], with_group_users=True, with_superusers=False
    )
    return sorted({u.email for u in users if u.is_active and u.email})


def notify_review_requested(*, run: AuditedRun, reason: str) -> int:
    """E-mail the run's team reviewers; returns how many messages went out (0 when disabled)."""
    if not getattr(settings, "REVIEW_NOTIFY_EMAIL", False):
        return 0
    recipients = team_reviewer_emails(run.team)
    if not recipients:
        return 0
    held = " Its answer is held until a reviewer approves it." if run.answer_held else ""
    site = settings.SITE_URL
    queue = f"{site}{reverse('audit:review_queue')}?team={run.team.slug}"
    body = (
        f"Run {run.pk} of team {run.team.name} awaits review (reason: {reason}).{held}\n\n"
        f"Review queue: {queue}\nRun: {site}{reverse('runs:detail', args=[run.pk])}\n"
    )
    try:
        # One message per reviewer: addresses of other reviewers are not shared.
        sent = sum(
            send_mail(f"[Conductor] Run awaiting review ({run.team.slug})", body, None, [to])
            for to in recipients
        )
    except Exception:  # a mail outage must not fail the run's commit hooks
        logger.exception("review notification for run %s failed", run.pk)
        return 0
    return sent
