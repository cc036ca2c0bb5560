"""What runs provides to audit (below it): the run models its review desk and retention use."""

from __future__ import annotations

from apps.audit import ports
from apps.runs.models import TERMINAL_RUN_STATUSES, ReviewStatus, Run, RunCall, RunEvent, Step


def install_audit_port() -> None:
    ports.register_runs(
        ports.RunsPort(
            run=Run,
            step=Step,
            run_event=RunEvent,
            run_call=RunCall,
            terminal_statuses=tuple(TERMINAL_RUN_STATUSES),
            review_none=ReviewStatus.NONE,
            review_pending=ReviewStatus.PENDING,
            review_flagged=ReviewStatus.FLAGGED,
        )
    )
