"""Budget alerts (issue 18): at 50 / 80 / 100 % of a team budget, a notice to the team's admins
and, when ``BUDGET_ALERT_WEBHOOK_URL`` is set, a webhook signed with ``BUDGET_ALERT_WEBHOOK_SECRET``.

Checked after every finished run (an after-commit run observer: never slows or breaks the run).
Each threshold of a budget window fires once (a unique row per team, period window and level), so
concurrent runs and retries cannot raise it twice. The webhook is posted off the run's thread with
retries and exponential backoff; every delivery is logged (``WebhookDelivery``) and its final
outcome audited.

Signature: ``X-Conductor-Signature: sha256=<hex>`` = HMAC-SHA256(secret, ``<timestamp>.<body>``)
with ``X-Conductor-Timestamp: <unix seconds>``, so a receiver can refuse replays.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import threading
import time
from decimal import Decimal
from typing import Any

import httpx
from django.conf import settings
from django.db import IntegrityError, close_old_connections, connection, transaction
from django.utils import timezone

from apps.audit.events import AuditEventType
from apps.audit.services import audit_record
from apps.governance.models import Team
from apps.insights.models import BudgetAlert, BudgetNotice, WebhookDelivery
from apps.policies.budgets import budget_status
from apps.policies.selectors import effective_policy_cached
from apps.runs.observers import RunEventView

logger = logging.getLogger(__name__)

THRESHOLDS = (50, 80, 100)


def _setting(name: str, default: Any) -> Any:
    return getattr(settings, name, None) or os.environ.get(name) or default


def webhook_url() -> str:
    return str(_setting("BUDGET_ALERT_WEBHOOK_URL", ""))


def sign(secret: str, timestamp: str, body: bytes) -> str:
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def team_admins(team: Any) -> list[Any]:
    """Active users who administer ``team`` (``manage_team``, directly or by role group)."""
    from guardian.shortcuts import get_users_with_perms

    users: Any = get_users_with_perms(
        team, only_with_perms_in=["manage_team"], with_group_users=True, with_superusers=False
    )
    return sorted((u for u in users if u.is_active), key=lambda u: u.pk)


def on_run_event(view: RunEventView) -> None:
    """After-commit observer: a finished run may have crossed a threshold of its team's budgets."""
    if view.type == "run.finished":
        budget_alerts_check(team_id=view.team_id, team=view.team, stamp=view.access_stamp)


def budget_alerts_check(
    *, team_id: int, team: Team | None = None, stamp: int | None = None
) -> list[BudgetAlert]:
    """Raise every threshold the team's budget windows have crossed and not yet raised. ``team``
    and ``stamp`` (the access version): what the caller already read, so none is read again."""

    if team is None or team.pk != team_id:
        team = Team.objects.get(pk=team_id)
    status = budget_status(team=team, effective=effective_policy_cached(team, stamp))
    raised = []
    for window in status.windows:
        used = window.used_percent
        limit = window.hard_usd if window.hard_usd is not None else window.soft_usd
        if used is None or limit is None:
            continue
        for threshold in THRESHOLDS:
            if used >= threshold:
                alert = _raise(team=team, window=window, threshold=threshold, limit=limit)
                if alert is not None:
                    raised.append(alert)
    return raised


def _raise(*, team: Any, window: Any, threshold: int, limit: Decimal) -> BudgetAlert | None:
    url = webhook_url()
    try:
        with transaction.atomic():
            alert = BudgetAlert.objects.create(
                team=team,
                period=window.name,
                period_start=window.starts_at,
                threshold=threshold,
                limit_usd=limit,
                spent_usd=window.spent,
            )
            BudgetNotice.objects.bulk_create([BudgetNotice(alert=alert, user=u) for u in team_admins(team)])
            if url:
                WebhookDelivery.objects.create(alert=alert, url=url)
            audit_record(
                event_type=AuditEventType.BUDGET_ALERT_RAISED,
                actor_label="system",
                team=team,
                obj=alert,
                payload={
                    "period": window.name,
                    "period_start": window.starts_at.isoformat(),
                    "threshold": threshold,
                    "limit_usd": str(limit),
                    "spent_usd": str(window.spent),
                    "webhook": bool(url),
                },
            )
            if url:
                transaction.on_commit(lambda: _start_delivery(alert.pk))
    except IntegrityError:
        return None  # already raised for this window (another run got there first)
    return alert


def payload(alert: BudgetAlert) -> dict[str, Any]:
    return {
        "type": "budget.alert",
        "team": alert.team.slug,
        "period": alert.period,
        "period_start": alert.period_start.isoformat(),
        "threshold_percent": alert.threshold,
        "limit_usd": str(alert.limit_usd),
        "spent_usd": str(alert.spent_usd),
        "raised_at": alert.created_at.isoformat(),
    }


def _start_delivery(alert_id: int) -> None:
    threading.Thread(
        target=_deliver_in_thread, args=(alert_id,), daemon=True, name=f"budget-webhook-{alert_id}"
    ).start()


def _deliver_in_thread(alert_id: int) -> None:
    try:
        deliver(alert_id)
    except Exception:
        logger.exception("budget alert %s: webhook delivery crashed", alert_id)
    finally:
        connection.close()  # this thread's own connection


def deliver(alert_id: int) -> WebhookDelivery:
    """Post the alert until a 2xx, at most ``BUDGET_ALERT_WEBHOOK_ATTEMPTS`` times, waiting
    ``BUDGET_ALERT_WEBHOOK_BACKOFF_S`` * 2^n between attempts. Logs each attempt; audits the end."""
    close_old_connections()
    delivery = WebhookDelivery.objects.select_related("alert__team").get(alert_id=alert_id)
    attempts = int(_setting("BUDGET_ALERT_WEBHOOK_ATTEMPTS", 5))
    backoff = float(_setting("BUDGET_ALERT_WEBHOOK_BACKOFF_S", 2.0))
    secret = str(_setting("BUDGET_ALERT_WEBHOOK_SECRET", ""))
    body = json.dumps(payload(delivery.alert), sort_keys=True).encode()
    while delivery.attempts < attempts and delivery.status == "pending":
        if delivery.attempts:
            time.sleep(backoff * 2 ** (delivery.attempts - 1))  # backoff between retries
        stamp = str(int(time.time()))
        headers = {"Content-Type": "application/json", "X-Conductor-Timestamp": stamp}
        if secret:
            headers["X-Conductor-Signature"] = sign(secret, stamp, body)
        delivery.attempts += 1
        try:
            resp = httpx.post(delivery.url, content=body, headers=headers, timeout=10)
            delivery.last_status_code, delivery.last_error = resp.status_code, ""
            if resp.is_success:
                delivery.status, delivery.delivered_at = "delivered", timezone.now()
        except httpx.HTTPError as exc:
            delivery.last_status_code, delivery.last_error = None, str(exc)[:300]
        if delivery.status == "pending" and delivery.attempts >= attempts:
            delivery.status = "failed"
        if delivery.status == "pending":
            delivery.save()
    # The ending and its audit row in one transaction: no reader sees one without the other.
    with transaction.atomic():
        delivery.save()
        audit_record(
            event_type=AuditEventType.BUDGET_ALERT_DELIVERED,
            actor_label="system",
            team=delivery.alert.team,
            obj=delivery.alert,
            payload={
                "status": delivery.status,
                "attempts": delivery.attempts,
                "status_code": delivery.last_status_code,
                "error": delivery.last_error,
            },
        )
    return delivery
