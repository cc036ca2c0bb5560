"""``manage.py apikey_create --team SLUG --name NAME [--scope runs:write ...]``: prints the new key once."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from apps.api.models import DEFAULT_SCOPES, ApiScope
from apps.api.services import apikey_create
from apps.governance.models import Team
from apps.workers.models import Pool


class Command(BaseCommand):
    help = "Create an API key for a team and print it (the only time it is shown)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--team", required=True, help="Team slug")
        parser.add_argument("--name", required=True, help="What the key is for")
        parser.add_argument(
            "--scope",
            action="append",
            dest="scopes",
            choices=ApiScope.values,
            help=f"A scope the key carries (repeat; default: {' '.join(DEFAULT_SCOPES)}). Capped by the "
            "role of the user it acts for in the team.",
        )
        parser.add_argument(
            "--pool",
            action="append",
            default=[],
            dest="pools",
            help="Allowed pool slug (repeat; default: every pool the team may use)",
        )
        parser.add_argument("--expires", help="Expiry, ISO 8601 (e.g. 2027-01-31T00:00)")
        parser.add_argument("--user", help="Username the key acts for (default: the team's first admin)")
        parser.add_argument("--rpm", type=int, help="Requests per minute")
        parser.add_argument("--tpm", type=int, help="Tokens per minute")

    def handle(self, *args: Any, **options: Any) -> None:
        team = Team.objects.filter(slug=options["team"]).first()
        if team is None:
            raise CommandError(f"No team with the slug {options['team']!r}.")
        pools = []
        for slug in options["pools"]:
            pool = Pool.objects.filter(slug=slug).first()
            if pool is None:
                raise CommandError(f"No pool with the slug {slug!r}.")
            pools.append(pool)
        expires = None
        if options["expires"]:
            try:
                expires = datetime.fromisoformat(options["expires"])
            except ValueError:
                raise CommandError("--expires must be ISO 8601, e.g. 2027-01-31T00:00") from None
            if timezone.is_naive(expires):
                expires = timezone.make_aware(expires, timezone.get_current_timezone())
        principal = None
        if options["user"]:
            principal = get_user_model().objects.filter(username=options["user"]).first()
            if principal is None:
                raise CommandError(f"No user {options['user']!r}.")
        try:
            created = apikey_create(
                actor=None,
                team=team,
                name=options["name"],
                scopes=options["scopes"],
                expires_at=expires,
                allowed_pools=pools,
                requests_per_minute=options["rpm"],
                tokens_per_minute=options["tpm"],
                principal=principal,
            )
        except ValidationError as exc:
            problems = "; ".join(f"{field}: {' '.join(msgs)}" for field, msgs in exc.message_dict.items())
            raise CommandError(problems) from None
        except PermissionDenied as exc:
            raise CommandError(str(exc)) from None
        key = created.api_key
        self.stderr.write(
            f"Created key “{key.name}” (prefix {key.prefix}, scopes {' '.join(key.scopes)}) for team {team.slug}, "
            f"acting for {key.created_by.get_username() if key.created_by else '—'}. "
            "It is shown once; store it now."
        )
        # The key alone on stdout so scripts can capture it: KEY=$(manage.py apikey_create …)
        self.stdout.write(created.plaintext)
