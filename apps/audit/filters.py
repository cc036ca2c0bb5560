"""Audit search filters, shared by the ``/audit/`` page, the export and ``GET /api/audit/events/``.

Query parameters (all optional):

``run``     a run id (UUID)
``team``    a team id or slug
``actor``   a user id or username; ``system`` for events without a user
``type``    an event type (``run.finished``) or a prefix ending in a dot (``policy.``)
``object``  ``app.model`` or ``app.model:id`` (e.g. ``workers.pool:3``)
``since``   ISO date or datetime, inclusive
``until``   ISO date or datetime, exclusive (a bare date means the end of that day)

Every filter maps onto an index of ``AuditEvent`` (team/actor/type/object/run/time, each with
``seq``), so a page of a filtered search stays fast at millions of rows. Callers must start from
``AuditEvent.objects.visible_to(user)``: filters never widen visibility.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping
from typing import Any

import django_filters
from django import forms
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from apps.audit import ports
from apps.audit.models import AuditEvent

FILTER_PARAMS = ("run", "team", "actor", "type", "object", "since", "until")


def _parse_moment(value: str, *, end_of_day: bool) -> dt.datetime:
    value = value.strip()
    moment = parse_datetime(value)
    if moment is None:
        day = parse_date(value)
        if day is None:
            raise ValueError(value)
        moment = dt.datetime.combine(day + dt.timedelta(days=1) if end_of_day else day, dt.time.min)
    if timezone.is_naive(moment):
        moment = timezone.make_aware(moment, dt.UTC)
    return as_utc(moment)


def as_utc(moment: dt.datetime) -> dt.datetime:
    """The moment in UTC: PostgreSQL refuses offsets past ±15:59 that ISO 8601 parsers accept
    (schemathesis sent -23:38); ``ValueError`` when UTC falls outside the years datetime holds."""
    try:
        return moment.astimezone(dt.UTC)
    except OverflowError:
        raise ValueError(f"{moment.isoformat()} is out of range") from None


def _apply(qs: QuerySet[AuditEvent], name: str, value: str) -> QuerySet[AuditEvent]:
    """Apply one filter; raises ``ValidationError({name: [...]})`` on a malformed value."""
    value = (value or "").strip()
    if not value:
        return qs
    if name == "run":
        # The full id, or the short one the pages show: a prefix of 8+ hex characters is a range
        # of ids on the (run_id, seq) index (apps.runs.search reads run references the same way).
        plain = value.lower().replace("-", "")
        if not (8 <= len(plain) <= 32) or any(c not in "0123456789abcdef" for c in plain):
            raise ValidationError(
                {"run": ["Enter a run id: the full id or its first 8 characters or more (e.g. 3f2a9c1d)."]}
            )
        low, high = uuid.UUID(plain.ljust(32, "0")), uuid.UUID(plain.ljust(32, "f"))
        return qs.filter(run_id=low) if low == high else qs.filter(run_id__gte=low, run_id__lte=high)
    if name == "team":
        if value.isdigit():
            return qs.filter(team_id=int(value))
        team_id = ports.governance().team_id_for_slug(value)
        return qs.filter(team_id=team_id) if team_id is not None else qs.none()
    if name == "actor":
        if value.isdigit():
            return qs.filter(actor_id=int(value))
        if value == "system":
            return qs.filter(actor_id__isnull=True)
        user_id = get_user_model().objects.filter(username=value).values_list("pk", flat=True).first()
        # A deleted user's events still carry the name they acted under.
        return qs.filter(actor_id=user_id) if user_id is not None else qs.filter(actor_label=value)
    if name == "type":
        if len(value) > 64:
            raise ValidationError({"type": ["An event type is at most 64 characters."]})
        return qs.filter(event_type__startswith=value) if value.endswith(".") else qs.filter(event_type=value)
    if name == "object":
        object_type, _, object_id = value.partition(":")
        if not object_type or "." not in object_type:
            raise ValidationError({"object": ["Use app.model or app.model:id, e.g. workers.pool:3."]})
        qs = qs.filter(object_type=object_type.lower())
        return qs.filter(object_id=object_id) if object_id else qs
    if name in ("since", "until"):
        try:
            moment = _parse_moment(value, end_of_day=name == "until")
        except ValueError:
            raise ValidationError(
                {name: ["Enter a date (2026-01-31) or date and time (2026-01-31T14:00)."]}
            ) from None
        return _time_bound(qs, name, moment)
    return qs


def _time_bound(qs: QuerySet[AuditEvent], name: str, moment: dt.datetime) -> QuerySet[AuditEvent]:
    """A time filter plus the matching seq bound, probed on the (created_at, seq) index.

    Exact because ``audit_record`` never lets created_at go backwards along seq. Without the bound PostgreSQL tends to walk the seq index backwards, testing created_at
    row by row (half a second for a day in the middle of a million events); with it the page is
    read straight from the right place.
    """
    base = AuditEvent.objects.all()
    if name == "since":
        qs = qs.filter(created_at__gte=moment)
        probe = base.filter(created_at__gte=moment).order_by("created_at", "seq")
        bound = probe.values_list("seq", flat=True).first()
        return qs.filter(seq__gte=bound) if bound is not None else qs.none()
    qs = qs.filter(created_at__lt=moment)
    probe = base.filter(created_at__lt=moment).order_by("-created_at", "-seq")
    bound = probe.values_list("seq", flat=True).first()
    return qs.filter(seq__lte=bound) if bound is not None else qs.none()


def filter_audit_events(qs: QuerySet[AuditEvent], params: Mapping[str, Any]) -> QuerySet[AuditEvent]:
    """Apply the search parameters to ``qs``. Raises ``ValidationError`` naming every bad field."""
    errors: dict[str, list[str]] = {}
    for name in FILTER_PARAMS:
        try:
            qs = _apply(qs, name, str(params.get(name) or ""))
        except ValidationError as exc:
            errors.update(exc.message_dict)
    if errors:
        raise ValidationError(errors)
    return qs


def active_filters(params: Mapping[str, Any]) -> dict[str, str]:
    """The non-empty search parameters (for links, exports and the export's audit record)."""
    return {k: str(params[k]).strip() for k in FILTER_PARAMS if str(params.get(k) or "").strip()}


class AuditFilterForm(forms.Form):
    """The ``/audit/`` search form (free text fields; validation is ``filter_audit_events``'s)."""

    since = forms.CharField(required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))
    until = forms.CharField(required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))
    team = forms.ChoiceField(required=False)
    actor = forms.CharField(required=False, max_length=150)
    type = forms.CharField(
        required=False, max_length=64, help_text="e.g. run.finished, or policy. for all policy events"
    )
    object = forms.CharField(required=False, max_length=130, help_text="app.model or app.model:id")
    run = forms.CharField(required=False, max_length=36)

    def __init__(self, *args: Any, teams: Any = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        team_field: Any = self.fields["team"]
        team_field.choices = [("", "All visible teams"), *((t.slug, t.name) for t in teams)]

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        try:
            filter_audit_events(AuditEvent.objects.none(), cleaned)
        except ValidationError as exc:
            for field, messages in exc.message_dict.items():
                for message in messages:
                    self.add_error(field if field in self.fields else None, message)
        return cleaned


class AuditEventFilterSet(django_filters.FilterSet):
    """For ``GET /api/audit/events/``: same parameters and semantics as the page."""

    run = django_filters.CharFilter(method="_filter", help_text="run id (UUID)")
    team = django_filters.CharFilter(method="_filter", help_text="team id or slug")
    actor = django_filters.CharFilter(method="_filter", help_text="user id or username; 'system'")
    type = django_filters.CharFilter(method="_filter", help_text="event type, or a prefix ending in '.'")
    object = django_filters.CharFilter(method="_filter", help_text="app.model or app.model:id")
    since = django_filters.CharFilter(method="_filter", help_text="ISO date/datetime (inclusive)")
    until = django_filters.CharFilter(method="_filter", help_text="ISO date/datetime (exclusive)")

    class Meta:
        model = AuditEvent
        fields: list[str] = []

    def _filter(self, qs: QuerySet[AuditEvent], name: str, value: str) -> QuerySet[AuditEvent]:
        return _apply(qs, name, value)

    @property
    def qs(self) -> QuerySet[AuditEvent]:
        # Validate all parameters together so a client gets every field's message at once
        # (DjangoFilterBackend turns the raised ValidationError into a 400).
        if not hasattr(self, "_qs"):
            try:
                filter_audit_events(AuditEvent.objects.none(), self.data)
            except ValidationError as exc:
                from rest_framework.exceptions import ValidationError as DRFValidationError

                raise DRFValidationError(exc.message_dict) from None
        return super().qs
