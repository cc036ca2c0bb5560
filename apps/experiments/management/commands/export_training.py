"""``manage.py export_training --team <slug> --kind conductor|chat --as <admin> [--out file]``."""

from __future__ import annotations

import sys
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.experiments import services
from apps.experiments.export import KINDS
from apps.governance.models import Team


class Command(BaseCommand):
    help = "Write a team's training export (JSONL) — audited, as a named team admin."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--team", required=True)
        parser.add_argument("--kind", choices=KINDS, default="conductor")
        parser.add_argument("--as", dest="username", required=True, help="the team admin it is done as")
        parser.add_argument("--out", default="-", help="file to write (default: stdout)")

    def handle(self, *args: Any, **options: Any) -> None:
        team = Team.objects.filter(slug=options["team"]).first()
        if team is None:
            raise CommandError(f"team: no team {options['team']!r}")
        user = get_user_model().objects.filter(username=options["username"]).first()
        if user is None:
            raise CommandError(f"as: no user {options['username']!r}")
        try:
            lines, summary = services.training_export(actor=user, team=team, kind=options["kind"])
        except PermissionError as err:
            raise CommandError(str(err)) from None
        out = sys.stdout if options["out"] == "-" else open(options["out"], "w", encoding="utf-8")  # noqa: SIM115
        try:
            out.writelines(lines)
        finally:
            if out is not sys.stdout:
                out.close()
        self.stderr.write(f"{summary['rows']} rows; skipped: {summary['skipped'] or 'none'}")
