"""/insights/: thin — the form reads the URL, selectors compute, the template hands JSON to plotly."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from apps.api import selectors as api_selectors
from apps.insights import selectors
from apps.insights.forms import InsightFilterForm
from apps.tools.selectors import tool_call_counts


@require_GET
@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    teams = selectors.visible_team_slugs(request.user)
    form = InsightFilterForm(
        request.GET or None,
        teams=teams,
        pools=selectors.visible_pool_slugs(request.user),
        workers=selectors.visible_worker_keys(request.user),
    )
    valid = form.is_valid() if form.is_bound else True
    start, end = form.window(timezone.now())
    filters = form.cleaned_data if form.is_bound and valid else {}
    scope = selectors.scope_for(user=request.user, start=start, end=end, filters=filters)
    data = selectors.insights(user=request.user, scope=scope)
    data["per_key"] = api_selectors.spend_per_key(scope)  # keys are the API's (a layer above)
    return render(
        request,
        "insights/dashboard.html",
        {
            "form": form,
            "data": data,
            "start": start,
            "end": end,
            "charts_json": data["charts"],
            "notices": selectors.notices_for(request.user),
            # Issue 43: tool calls, refusals and approvals of the visible teams in the window.
            "tool_calls": tool_call_counts(scope.team_ids, start, end),
        },
        status=200 if valid else 400,
    )
