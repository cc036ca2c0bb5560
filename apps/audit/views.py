"""Audit pages: search, event detail, export, verification, the review queue and review posts.

Thin: visibility from ``apps.governance.selectors`` (an event or run you cannot see is a 404),
writes through ``apps.audit.services``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.handlers.asgi import ASGIRequest
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from apps.audit import evidence, export, logkeys, selectors, services, tasks
from apps.audit.checkpoints import log_origin
from apps.audit.filters import AuditFilterForm, active_filters, filter_audit_events
from apps.audit.forms import (
    PAGE_PARAMS,
    BulkReviewForm,
    FlagResolveForm,
    ReviewQueueFilterForm,
    RunReviewForm,
    bad_search_response,
    search_param_errors,
)
from apps.audit.logkeys import log_verifiers
from apps.audit.models import AuditEvent
from apps.audit.ports import AuditedRun
from apps.audit.verify import verify_and_record
from apps.governance import selectors as gov
from apps.governance.models import Team
from apps.governance.visibility import is_platform_admin
from apps.policies.models import PolicyVersion
from apps.runs import review_queue as desk
from apps.runs import reviews as run_reviews
from apps.runs.approvals import approvals_to_decide, tool_hold_view
from apps.runs.models import Run
from apps.runs.review_queue import TABS
from apps.runs.selectors import run_content_visible


def _int_param(request: HttpRequest, name: str) -> int | None:
    raw = request.GET.get(name, "")
    return int(raw) if raw.isdigit() else None


def _filter_form(request: HttpRequest) -> AuditFilterForm:
    teams = gov.teams_with_audit_visible_to(request.user) if not is_platform_admin(request.user) else None
    if teams is None:
        teams = Team.objects.all()
    return AuditFilterForm(request.GET or None, teams=teams.order_by("slug"))


@require_GET
def event_list(request: HttpRequest) -> HttpResponse:
    if errors := search_param_errors(request.GET, allowed_extra=PAGE_PARAMS, reject_unknown=False):
        return bad_search_response(errors)
    form = _filter_form(request)
    qs = AuditEvent.objects.visible_to(request.user, "view")
    params = active_filters(request.GET)
    if form.is_bound and not form.is_valid():
        page = selectors.Page([], None, None)
    else:
        qs = filter_audit_events(qs, params)
        page = selectors.page_of_events(
            qs, before=_int_param(request, "before"), after=_int_param(request, "after")
        )
    query = urlencode(params)
    return render(
        request,
        "audit/event_list.html",
        {
            "form": form,
            "page": page,
            "query": query,
            "has_filters": bool(params),
            "chain": selectors.chain_state(),
            "log": selectors.log_state(),
            "can_verify": selectors.can_verify_chain(request.user),
            "total": selectors.capped_total(qs) if page.events or page.pending else 0,
            "total_cap": selectors.TOTAL_CAP,
        },
    )


@require_GET
def event_detail(request: HttpRequest, seq: int) -> HttpResponse:
    event = get_object_or_404(AuditEvent.objects.visible_to(request.user, "view"), seq=seq)
    payload = dict(event.payload or {})
    changes = payload.pop("changes", None)
    return render(
        request,
        "audit/event_detail.html",
        {
            "event": event,
            "payload_json": json.dumps(payload, indent=2, sort_keys=True, ensure_ascii=False),
            "changes": changes if isinstance(changes, dict) else None,
            "linked": selectors.linked_events(event, request.user),
            "chain": selectors.chain_state(),
            "policy_version": _policy_version(event.policy_version_id),
        },
    )


def _policy_version(version_id: int | None) -> Any:
    """The policy version by its number (v4 of a policy), never its database id (issue 42)."""
    if version_id is None:
        return None
    return PolicyVersion.objects.select_related("policy", "policy__team").filter(pk=version_id).first()


@require_GET
def event_export(request: HttpRequest, export_format: str) -> HttpResponse | StreamingHttpResponse:
    if export_format not in export.FORMATS:
        raise Http404("Unknown export format (use csv or jsonl).")
    if errors := search_param_errors(request.GET):
        return bad_search_response(errors)
    params = active_filters(request.GET)
    try:
        qs = filter_audit_events(AuditEvent.objects.visible_to(request.user, "view"), params)
    except ValidationError as exc:
        messages.error(
            request,
            "Fix the search before exporting: "
            + "; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items()),
        )
        return redirect(reverse("audit:event_list"))
    recorded = services.audit_export_record(actor=request.user, export_format=export_format, filters=params)
    assert recorded.seq is not None  # audit_export_record returns the event sequenced
    # The export is a fixed snapshot: everything before its own audit record.
    chunks = export.export_chunks(qs.filter(seq__lt=recorded.seq), export_format)
    content_type, ext = export.FORMATS[export_format]
    streaming = export.as_async(chunks) if isinstance(request, ASGIRequest) else chunks
    response = StreamingHttpResponse(streaming, content_type=content_type)
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    response["Content-Disposition"] = f'attachment; filename="audit-{stamp}-upto{recorded.seq - 1}.{ext}"'
    response["X-Audit-Export-Seq"] = str(recorded.seq)
    return response


# Above this many events the walk (about 10k events/s) runs in the background, not in the request.
VERIFY_INLINE_MAX = 100_000


@require_POST
def verify_now(request: HttpRequest) -> HttpResponse:
    if not selectors.can_verify_chain(request.user):
        raise PermissionDenied(
            "Starting a verification needs the reviewer or admin role on a team "
            "(permission review_team_runs)."
        )
    if selectors.chain_state().head_seq > VERIFY_INLINE_MAX:
        _verify_in_background()
        messages.info(request, "Verification started; this page shows the result when it finishes.")
        return redirect(reverse("audit:event_list"))
    result = verify_and_record(key=services.hmac_key())
    (messages.success if result.ok else messages.error)(request, result.summary())
    return redirect(reverse("audit:event_list"))


def _verify_in_background() -> None:
    from django.conf import settings

    if settings.EXECUTION_BACKEND == "celery":
        tasks.audit_verify.delay()
        return

    def work() -> None:
        from django.db import connection

        try:
            tasks.audit_verify.run()
        finally:
            connection.close()

    threading.Thread(target=work, name="audit-verify", daemon=True).start()


@require_GET
def review_queue(request: HttpRequest) -> HttpResponse:
    teams = gov.teams_reviewable_by(request.user).order_by("slug")
    form = ReviewQueueFilterForm(request.GET or None, teams=teams)
    filters = form.cleaned_data if form.is_valid() else {}
    tab = filters.get("tab") or "pending"
    qs = desk.review_queue(
        request.user,
        tab=tab,
        team=filters.get("team"),
        reason=filters.get("reason") or "",
        age=filters.get("age") or "",
    )
    runs = list(qs[: desk.QUEUE_PAGE])
    approvals = list(approvals_to_decide(request.user))
    for a in approvals:
        # A held tool call shows its tool and (to who may see the run's content) its arguments.
        a.tool_view = tool_hold_view(  # type: ignore[attr-defined]  # for the template only
            a, content_visible=run_content_visible(user=request.user, run=a.run)
        )
    answers_waiting = desk.awaiting_review_count(request.user)
    params = {k: v for k, v in request.GET.items() if k in form.fields and v and k != "tab"}
    return render(
        request,
        "audit/review_queue.html",
        {
            "form": form,
            "tab": tab,
            "tabs": [(key, label, urlencode({**params, "tab": key})) for key, label in TABS.items()],
            "items": desk.queue_items(
                runs, content_visible=lambda run: run_content_visible(user=request.user, run=run)
            ),
            "total": qs.count() if len(runs) == desk.QUEUE_PAGE else len(runs),
            "shown": len(runs),
            "here": request.get_full_path(),
            "has_filters": bool(params),
            "approvals": approvals[:50],
            "tool_calls_waiting": sum(1 for a in approvals if a.kind == "tool"),
            "plans_waiting": sum(1 for a in approvals if a.kind != "tool"),
            "answers_waiting": answers_waiting,
            # One count for the nav badge and the desk: answers to review plus plans to decide.
            "waiting_total": answers_waiting + len(approvals),
        },
    )


def _flash_errors(request: HttpRequest, errors: Mapping[str, Iterable[Any]]) -> None:
    # The desk redirects back to the queue after a refused post: the errors travel as messages.
    for field_errors in errors.values():
        for error in field_errors:
            messages.error(request, str(error))


@require_POST
def review_bulk(request: HttpRequest) -> HttpResponse:
    """Approve the selected runs with one note (all or none)."""
    form = BulkReviewForm(request.POST)
    target = _safe_next(request) or reverse("audit:review_queue")
    if not form.is_valid():
        _flash_errors(request, form.errors)
        return redirect(target)
    ids = form.cleaned_data["run"]
    runs = list(Run.objects.visible_to(request.user, "view").select_related("team").filter(pk__in=ids))
    if len(runs) != len(set(ids)):
        raise Http404("A selected run does not exist or is not visible to you.")
    try:
        reviews = run_reviews.run_review_bulk(actor=request.user, runs=runs, note=form.cleaned_data["note"])
    except ValidationError as exc:
        _flash_errors(request, exc.message_dict)
        return redirect(target)
    released = sum(1 for r in reviews if r.released_answer)
    note = f" {released} held answer{'s' if released != 1 else ''} released." if released else ""
    messages.success(request, f"Signed off {len(reviews)} run{'s' if len(reviews) != 1 else ''}.{note}")
    return redirect(target)


@require_POST
def flag_resolve(request: HttpRequest, run_id: Any) -> HttpResponse:
    run = get_object_or_404(Run.objects.visible_to(request.user, "view").select_related("team"), pk=run_id)
    if not Run.objects.allows(request.user, "review", run):
        raise PermissionDenied(
            "Resolving a flag needs the reviewer or admin role on the run's team (permission review_team_runs)."
        )
    form = FlagResolveForm(request.POST)
    target = _safe_next(request) or reverse("runs:detail", args=[run.pk])
    if not form.is_valid():
        _flash_errors(request, form.errors)
        return redirect(target)
    try:
        run_reviews.run_flag_resolve(actor=request.user, run=run, note=form.cleaned_data["note"])
    except ValidationError as exc:
        _flash_errors(request, exc.message_dict)
        return redirect(target)
    messages.success(request, "Flag resolved.")
    return redirect(target)


@require_GET
def run_export(request: HttpRequest, run_id: Any) -> HttpResponse | StreamingHttpResponse:
    """A run's audit events as verifiable JSON Lines: signed tree head, each event's inclusion
    proof and the MACed end record (``scripts/verify_audit_export.py`` checks it offline)."""
    run = get_object_or_404(Run.objects.visible_to(request.user, "view").select_related("team"), pk=run_id)
    if not Run.objects.allows(request.user, "review", run):
        raise PermissionDenied(
            "Exporting a run's evidence needs the reviewer or admin role on its team "
            "(permission review_team_runs)."
        )
    recorded = services.audit_export_record(
        actor=request.user, export_format="jsonl", filters={"run": str(run.pk)}
    )
    assert recorded.seq is not None  # audit_export_record returns the event sequenced
    qs = AuditEvent.objects.visible_to(request.user, "view").filter(run_id=run.pk, seq__lt=recorded.seq)
    chunks = export.export_chunks(qs, "jsonl")
    streaming = export.as_async(chunks) if isinstance(request, ASGIRequest) else chunks
    response = StreamingHttpResponse(streaming, content_type=export.FORMATS["jsonl"][0])
    response["Content-Disposition"] = f'attachment; filename="run-{run.pk}-evidence.jsonl"'
    response["X-Audit-Export-Seq"] = str(recorded.seq)
    return response


def review_panel_context(
    request: HttpRequest, run: AuditedRun, form: RunReviewForm | None = None
) -> dict[str, Any]:
    """Context for ``audit/_review_panel.html`` (the run page includes the partial)."""
    return {
        "run": run,
        "reviews": selectors.reviews_for_run(run),
        "can_review": Run.objects.allows(request.user, "review", run),
        "review_form": form or RunReviewForm(),
    }


@require_POST
def run_review(request: HttpRequest, run_id: Any) -> HttpResponse:
    run = get_object_or_404(Run.objects.visible_to(request.user, "view").select_related("team"), pk=run_id)
    if not Run.objects.allows(request.user, "review", run):
        raise PermissionDenied(
            "Reviewing this run needs the reviewer or admin role on its team (permission review_team_runs)."
        )
    form = RunReviewForm(request.POST)
    if form.is_valid():
        try:
            review = run_reviews.run_review(
                actor=request.user,
                run=run,
                status=form.cleaned_data["status"],
                reason=form.cleaned_data["reason"],
                comment=form.cleaned_data["comment"],
            )
        except ValidationError as exc:
            for field, errors in exc.message_dict.items():
                for error in errors:
                    form.add_error(field if field in form.fields else None, error)
        else:
            note = " The held answer is released." if review.released_answer else ""
            messages.success(request, f"Review recorded: {review.get_status_display()}.{note}")
            return redirect(_next_url(request, run))
    return render(
        request, "audit/review_form_page.html", review_panel_context(request, run, form), status=400
    )


def _safe_next(request: HttpRequest) -> str:
    target = request.POST.get("next", "")
    if target and url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        return target
    return ""


def _next_url(request: HttpRequest, run: AuditedRun) -> str:
    return _safe_next(request) or reverse("runs:detail", args=[run.pk])


# --- the log's keys and evidence packs (issue 40) ---------------------------------------------


@require_GET
def log_keys(request: HttpRequest) -> HttpResponse:
    """``/audit/log/keys``: the verifier keys, to anyone (they are public by design)."""
    origin = log_origin()
    lines = [
        f"# audit log {origin}",
        "# log keys (c2sp.org/signed-note Ed25519); the first signs new checkpoints",
        *(k.vkey for k in log_verifiers(origin)),
        "# witnesses (c2sp.org/tlog-cosignature, cosignature/v1)",
        *(w.key.vkey for w in logkeys.witnesses()),
    ]
    response = HttpResponse("".join(f"{line}\n" for line in lines), content_type="text/plain; charset=utf-8")
    response["Access-Control-Allow-Origin"] = "*"
    return response


def _pack_response(request: HttpRequest, qs: Any, scope: evidence.Scope, name: str) -> StreamingHttpResponse:
    chunks = evidence.pack_chunks(qs, scope)
    streaming = export.as_async(chunks) if isinstance(request, ASGIRequest) else chunks
    response = StreamingHttpResponse(streaming, content_type="application/zip")
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    response["X-Audit-Export-Seq"] = str(scope.export_seq)
    return response


def _retention(teams: Any) -> list[tuple[str, int | None]]:
    return [(t.slug, t.retention_days) for t in teams.order_by("slug")]


@require_GET
def evidence_pack(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    """A zip of the filtered selection (a team, a time range, …) with proofs, checkpoints, keys,
    the verifier and a README: what a reviewer hands an auditor."""
    if errors := search_param_errors(request.GET):
        return bad_search_response(errors)
    params = active_filters(request.GET)
    try:
        qs = filter_audit_events(AuditEvent.objects.visible_to(request.user, "view"), params)
    except ValidationError as exc:
        return bad_search_response({k: " ".join(v) for k, v in exc.message_dict.items()})
    recorded = services.audit_export_record(actor=request.user, export_format="evidence", filters=params)
    assert recorded.seq is not None  # audit_export_record returns the event sequenced
    teams = (
        gov.teams_with_audit_visible_to(request.user)
        if not is_platform_admin(request.user)
        else Team.objects.all()
    )
    if params.get("team"):
        teams = teams.filter(slug=params["team"])
    scope = evidence.Scope(
        title=", ".join(f"{k} {v}" for k, v in params.items()) or "every event you may see",
        filters=params,
        retention=_retention(teams),
        requested_by=request.user.get_username(),
        export_seq=recorded.seq,
    )
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    return _pack_response(request, qs.filter(seq__lt=recorded.seq), scope, f"audit-evidence-{stamp}.zip")


@require_GET
def run_evidence_pack(request: HttpRequest, run_id: Any) -> StreamingHttpResponse:
    """A run's evidence pack (the run's audit events); needs the review right on its team."""
    run = get_object_or_404(Run.objects.visible_to(request.user, "view").select_related("team"), pk=run_id)
    if not Run.objects.allows(request.user, "review", run):
        raise PermissionDenied(
            "A run's evidence pack needs the reviewer or admin role on its team (permission review_team_runs)."
        )
    params = {"run": str(run.pk)}
    recorded = services.audit_export_record(actor=request.user, export_format="evidence", filters=params)
    assert recorded.seq is not None
    qs = AuditEvent.objects.visible_to(request.user, "view").filter(run_id=run.pk, seq__lt=recorded.seq)
    scope = evidence.Scope(
        title=f"run {run.pk}",
        filters=params,
        retention=_retention(Team.objects.filter(pk=run.team_id)),
        requested_by=request.user.get_username(),
        export_seq=recorded.seq,
    )
    return _pack_response(request, qs, scope, f"run-{run.pk}-evidence.zip")
