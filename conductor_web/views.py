"""Home redirect and the error pages (403/404/500): friendly, and each says why when it can."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, HttpResponseServerError
from django.shortcuts import redirect, render
from django.template import loader

from apps.audit.selectors import reviews_any_team
from apps.governance.selectors import teams_runnable_by


def home(request: HttpRequest) -> HttpResponse:
    """Where a signed-in user starts (also where login lands): the playground, or for a reviewer
    who cannot start runs, the review desk (issue 42: not a playground that says "no pool")."""
    user = request.user
    if user.is_authenticated and reviews_any_team(user) and not teams_runnable_by(user).exists():
        return redirect("audit:review_queue")
    return redirect("playground")


def _reason(exception: Exception | None) -> str:
    # Messages of PermissionDenied/Http404 are written by our views for users (they name the missing
    # role or permission); the resolver's own 404s carry a dict of patterns, which is not for users.
    if exception is None or not exception.args or not isinstance(exception.args[0], str):
        return ""
    return exception.args[0]


def permission_denied(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return render(request, "403.html", {"exception": _reason(exception)}, status=403)


def page_not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return render(request, "404.html", {"exception": _reason(exception)}, status=404)


def server_error(request: HttpRequest) -> HttpResponse:
    # No request context: whatever broke (the database, a context processor) must not break this.
    return HttpResponseServerError(loader.get_template("500.html").render({}))
