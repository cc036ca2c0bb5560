"""Celery entry points (the beat schedule / embedded timer thread call these)."""

from __future__ import annotations

from celery import shared_task

from apps.audit.checkpoints import checkpoint_publish
from apps.audit.services import hmac_key
from apps.audit.verify import verify_and_record


@shared_task(name="apps.audit.tasks.audit_verify", ignore_result=True)
def audit_verify() -> bool:
    """Verify the whole chain and record the outcome on the chain head (the UI shows it)."""

    return verify_and_record(key=hmac_key()).ok


@shared_task(name="apps.audit.tasks.audit_sth_publish", ignore_result=True)
def audit_sth_publish() -> int:
    """Sign the tree head, have the witnesses cosign it and append it to
    ``AUDIT_STH_PUBLISH_PATH``; idempotent per tree size."""

    return checkpoint_publish().tree_size
