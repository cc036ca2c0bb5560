"""``manage.py audit_retention_sweep``: erase run prompts/outputs older than each team's retention."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from apps.runs.retention import retention_sweep


class Command(BaseCommand):
    help = "Erase run content older than the team's retention_days (the audit trail keeps hashes)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--limit", type=int, default=None, help="erase at most this many runs")

    def handle(self, *args: Any, **options: Any) -> None:
        erased = retention_sweep(limit=options.get("limit"))
        self.stdout.write(f"erased the content of {erased} run(s)")
