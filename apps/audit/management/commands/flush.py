"""``manage.py flush`` that may empty the audit table on SQLite.

The SQLite append-only trigger refuses DELETE unless ``audit_guard_active()`` is 0, which only
this command sets, for its own duration and process (the test framework flushes between
transactional tests; an operator wiping a demo database means it). PostgreSQL flushes with
TRUNCATE, which the row-level trigger does not see.
"""

from __future__ import annotations

from typing import Any

from django.core.management.commands.flush import Command as FlushCommand

from apps.audit.apps import GUARD


class Command(FlushCommand):
    def handle(self, **options: Any) -> None:
        GUARD["active"] = 0
        try:
            super().handle(**options)
        finally:
            GUARD["active"] = 1
