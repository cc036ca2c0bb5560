"""Playground, runs list and run page. Thin: forms validate, services write, selectors read."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlencode

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import render
from django.template import TemplateDoesNotExist
from django.template.loader import get_template
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from apps.audit.selectors import TOTAL_CAP, capped_total
from apps.governance import selectors as gov
from apps.learning.selectors import decision_for_run
from apps.policies.models import Policy
from apps.runs import approvals, integration, search, selectors, services
from apps.runs.forms import PlaygroundForm, RunFilterForm, split_strategy
from apps.runs.models import Run, RunSource, Strategy
from apps.workers.models import ProviderKind, Worker

if TYPE_CHECKING:
    from django.forms import ModelChoiceField

    from apps.workers.models import Pool

PAGE_SIZE = 50
MAX_SUBTASK_CHARS = 4000


def _template_exists(name: str) -> bool:
    try:
        get_template(name)
    except TemplateDoesNotExist:
        return False
    return True


def _visible_ids(request: HttpRequest, *names: str) -> list[str]:
    ids = [request.GET.get(n, "") for n in names]
    return (
        [i for i in ids if i and selectors.run_get_visible(user=request.user, run_id=i) is not None]
        if all(_is_uuid(i) for i in ids if i)
        else []
    )


def _is_uuid(value: str) -> bool:
    import uuid

    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


def _local_models(pool_ids: list[Any]) -> dict[Any, list[str]]:
    """Pool id -> the local (llama.cpp demo) models in it: such pools carry a visible warning."""
    rows = Worker.objects.filter(provider__kind=ProviderKind.LOCAL, pool_entries__pool__in=pool_ids)
    found: dict[Any, list[str]] = {}
    for pool_id, model in rows.values_list("pool_entries__pool_id", "model_name").distinct():
        found.setdefault(pool_id, []).append(model)
    return found


def _view_entry(request: HttpRequest, run: Run, local: dict[Any, list[str]]) -> dict[str, Any]:
    """What templates/runs/_run_view.html needs besides the live state the websocket brings."""
    return {
        "id": str(run.id),
        "can_cancel": not run.is_terminal and _may_cancel(request, run),
        "local_models": local.get(run.pool_id, []),
        # Offer only what step_replay accepts (issue 42): with input guardrails, an edited subtask
        # is refused, so the form says so up front and offers the unchanged replay.
        "replay_guarded": _input_guardrails(run.team),
    }


def _strategy_value(run: Run) -> str:
    return f"{run.strategy}-{run.preset}" if run.preset else run.strategy


def playground(request: HttpRequest) -> HttpResponse:
    form = PlaygroundForm(request.POST or None, user=request.user)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        ids = []
        try:
            for choice in [data["strategy"], data.get("compare")]:
                if not choice:
                    continue
                strategy, preset = split_strategy(choice)
                run = services.run_create(
                    actor=request.user,
                    team=data.get("team"),
                    pool=data["pool"],
                    question=data["prompt"],
                    strategy=strategy,
                    preset=preset,
                    worker=data.get("worker") if strategy == Strategy.SINGLE else None,
                    source=RunSource.PLAYGROUND,
                )
                ids.append(str(run.id))
        except services.RunRefused as exc:
            form.add_error(None, exc.message)
        else:
            query = {"run": ids[0]} | ({"compare": ids[1]} if len(ids) > 1 else {})
            return HttpResponseRedirect(f"{reverse('playground')}?{urlencode(query)}")
    shown = [
        run
        for run in (
            selectors.run_get_visible(user=request.user, run_id=i)
            for i in _visible_ids(request, "run", "compare")
        )
        if run is not None
    ]
    # ?replay=<run> fills the form from an earlier run (question, pool, strategy) to run it again
    # with changes; ?run=<run> shows a run and keeps its question in the form.
    replay_of = _visible_ids(request, "replay")
    source = (
        selectors.run_get_visible(user=request.user, run_id=replay_of[0])
        if replay_of
        else (shown[0] if shown else None)
    )
    if request.method == "GET" and source is not None and not form.is_bound:
        initial: dict[str, Any] = {
            "prompt": source.question,
            "pool": source.pool_id,
            "strategy": _strategy_value(source),
        }
        if len(shown) > 1:
            initial["compare"] = _strategy_value(shown[1])
        form = PlaygroundForm(initial=initial, user=request.user)
    pools = cast("ModelChoiceField[Pool]", form.fields["pool"]).queryset
    assert pools is not None  # PlaygroundForm.__init__ always sets it
    local = _local_models([p.pk for p in pools] + [r.pool_id for r in shown])
    context = {
        "form": form,
        "runs": [_view_entry(request, run, local) for run in shown],
        "has_pools": pools.exists(),
        "local_pools": [{"name": p.name, "models": local[p.pk]} for p in pools if p.pk in local],
        "replay_of": source if replay_of else None,
    }
    return render(request, "runs/playground.html", context)


def run_list(request: HttpRequest) -> HttpResponse:
    form = RunFilterForm(request.GET or None)
    valid = form.is_valid()
    filters = form.cleaned_data if valid else {}
    qs = selectors.run_list(
        user=request.user,
        team=filters.get("team") or None,
        created_by=filters.get("user") or None,
        status=filters.get("status") or None,
        strategy=filters.get("strategy") or None,
        worker=filters.get("worker") or None,
        date_from=filters.get("date_from"),
        date_to=filters.get("date_to"),
        sort=filters.get("sort") or "newest",
        text=filters.get("q") or None,
        run_ref=filters.get("id") or None,
        pool=filters.get("pool") or None,
        api_key=filters.get("key") or None,
        model=filters.get("model") or None,
        request_id=filters.get("request_id") or None,
        metadata=filters.get("metadata"),
        client_user=filters.get("client_user") or None,
    )
    if request.GET and not valid:
        qs = qs.none()  # a search that did not parse lists nothing (its error says why), not everything
    raw_page = request.GET.get("page") or "1"
    page = int(raw_page) if raw_page.isdigit() and len(raw_page) <= 9 else 0
    if page < 1:
        raise Http404("There is no such page of runs: page must be a number from 1 to 999999999.")
    # No COUNT(*): one extra row tells whether a next page exists (fast at any table size).
    offset = (page - 1) * PAGE_SIZE
    rows = list(qs[offset : offset + PAGE_SIZE + 1])
    if page > 1 and not rows:
        raise Http404(f"Page {page} is past the last page of runs for this search.")
    params = request.GET.copy()
    params.pop("page", None)
    return render(
        request,
        "runs/run_list.html",
        {
            "form": form,
            "runs": rows[:PAGE_SIZE],
            "page": page,
            "has_next": len(rows) > PAGE_SIZE,
            "has_prev": page > 1,
            "total": capped_total(qs),  # counts at most TOTAL_CAP + 1 rows (no full COUNT(*))
            "total_cap": TOTAL_CAP,
            "query": params.urlencode(),
            "teams": gov.teams_with_runs_visible_to(request.user).order_by("slug"),
        },
    )


def run_by_short_id(request: HttpRequest, ref: str) -> HttpResponse:
    """``/runs/<8 characters>/``: the short id the pages show leads to the run (or, if it names
    several runs you may see, to the list of them)."""
    qs = Run.objects.visible_to(request.user, "view")
    run, count = search.resolve_run_ref(qs, ref)
    if run is not None:
        return HttpResponseRedirect(reverse("runs:detail", args=[run.pk]))
    if count > 1:
        return HttpResponseRedirect(f"{reverse('runs:list')}?{urlencode({'id': ref})}")
    raise Http404(f"No run you may see has an id starting with {ref}.")


def run_detail(request: HttpRequest, run_id: str) -> HttpResponse:
    run = selectors.run_get_visible(user=request.user, run_id=run_id)
    if run is None:
        raise Http404("No such run.")
    decisions = [selectors.event_dict(e) for e in selectors.run_decisions(run)]
    content_visible = selectors.run_content_visible(user=request.user, run=run)
    if not content_visible:
        decisions = [selectors.withhold_event(e) for e in decisions]
    version = run.policy_version
    context = {
        "run": run,
        "view": _view_entry(request, run, _local_models([run.pool_id])) | {"on_run_page": True},
        "policy_version": version,
        "policy_visible": version is not None and Policy.objects.allows(request.user, "view", version.policy),
        "decisions": decisions,
        "content_withheld": not content_visible,
        "held_reason": selectors.held_reason(selectors.run_hold_rules(run.pk)) if run.answer_held else "",
        "audit_events": selectors.run_audit_events(user=request.user, run=run)[:200],
        "review_panel": "audit/_review_panel.html" if _template_exists("audit/_review_panel.html") else None,
        "approval": _approval_context(request, run),
        "learning_decision": _learning_decision(run),
    }
    return render(request, "runs/run_detail.html", context)


def _learning_decision(run: Run) -> Any:
    """The learned router's choice for this run ("why this arm"), when it routed it."""
    if run.strategy != Strategy.LEARNED:
        return None
    return decision_for_run(run.id)


def _approval_context(request: HttpRequest, run: Run) -> dict[str, Any] | None:
    """The held plan (or the decisions taken on earlier ones) for the run page's approval panel."""
    history = list(run.approvals.select_related("decided_by").order_by("requested_at"))
    if not history:
        return None
    pending = next((a for a in history if a.decision == "pending"), None)
    mine = run.created_by_id is not None and run.created_by_id == request.user.pk
    tool = None
    if pending is not None and pending.kind == "tool":
        tool = approvals.tool_hold_view(
            pending, content_visible=selectors.run_content_visible(user=request.user, run=run)
        )
    return {
        "pending": pending,
        "tool": tool,
        "history": [a for a in history if a is not pending],
        "may_decide": pending is not None and not mine and approvals.can_approve(request.user, run),
        "own_run": mine,
    }


@require_GET
def run_snapshot(request: HttpRequest, run_id: str) -> JsonResponse:
    """The websocket's opening snapshot over plain HTTP: what the run page polls while the channel
    layer is unreachable (Redis down), withheld per viewer exactly as on the websocket."""
    run = selectors.run_get_visible(user=request.user, run_id=run_id)
    if run is None:
        raise Http404("No such run.")
    snapshot, _access = selectors.run_snapshot(user=request.user, run_id=run.pk)
    response = JsonResponse(snapshot)
    response["Cache-Control"] = "no-store"
    return response


def _may_cancel(request: HttpRequest, run: Run) -> bool:
    return Run.objects.allows(request.user, "cancel", run)


@require_POST
def run_cancel(request: HttpRequest, run_id: str) -> HttpResponse:
    run = selectors.run_get_visible(user=request.user, run_id=run_id)
    if run is None:
        raise Http404("No such run.")
    try:
        run = services.run_cancel(actor=request.user, run=run)
    except PermissionError as exc:
        raise PermissionDenied(str(exc)) from None
    if "application/json" in request.headers.get("Accept", ""):
        # The run view cancels in place: the live graph keeps its state and shows the ending.
        return JsonResponse(
            {"id": str(run.id), "status": run.status, "cancel_requested": run.cancel_requested}
        )
    messages.success(request, "Cancellation requested: the run stops at the next step boundary.")
    return HttpResponseRedirect(_safe_next(request, reverse("runs:detail", args=[run.id])))


def _safe_next(request: HttpRequest, default: str) -> str:
    # "//evil.example" and "/\\evil.example" start with "/" yet leave the site: only same-host URLs.
    target = request.POST.get("next", "")
    if target and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return target
    return default


@require_POST
def step_replay(request: HttpRequest, run_id: str, index: int) -> HttpResponse:
    run = selectors.run_get_visible(user=request.user, run_id=run_id)
    if run is None:
        raise Http404("No such run.")
    if not selectors.run_content_visible(user=request.user, run=run):
        # The messages carry earlier outputs of the held run.
        raise PermissionDenied(
            "This run's answer is held for review (a require_review guardrail of its team's policy): "
            "its steps can be replayed once a reviewer releases it."
        )
    step = run.steps.filter(index=index).first()
    if step is None or not step.messages:
        raise Http404("That step has no recorded messages to replay.")
    worker = step.worker or Worker.objects.filter(slug=step.worker_key).first()
    replay = [dict(m) for m in step.messages if isinstance(m, dict)]
    instruction = request.POST.get("instruction", "").strip()
    if instruction and instruction != step.instruction:
        # The subtask is the last user message the worker saw (apps.engine.executor.build_messages).
        if len(instruction) > MAX_SUBTASK_CHARS:
            messages.error(request, f"The subtask is too long ({MAX_SUBTASK_CHARS} characters at most).")
            return HttpResponseRedirect(reverse("runs:detail", args=[run.id]))
        guarded = _input_guardrails(run.team)
        if guarded:
            # The replay sends its messages verbatim, past the input guardrails: new text must not.
            messages.error(
                request,
                "This team's policy checks input with "
                + ", ".join(guarded)
                + ": an edited subtask would reach the worker without those checks, so only an "
                "unchanged replay is offered. Ask the question again in the playground instead.",
            )
            return HttpResponseRedirect(reverse("runs:detail", args=[run.id]))
        if replay and replay[-1].get("role") == "user":
            replay[-1]["content"] = instruction
        else:
            replay.append({"role": "user", "content": instruction})
    try:
        new = services.run_create(
            actor=request.user,
            team=run.team,
            pool=run.pool,
            # The run's own question, so the playground keeps it (the messages carry the subtask).
            question=run.question or _last_user_message(replay),
            strategy=Strategy.SINGLE,
            preset="",
            worker=worker,
            source=RunSource.PLAYGROUND,
            replay_messages=replay,
        )
    except services.RunRefused as exc:
        if exc.code == "pool_not_allowed":
            raise PermissionDenied(exc.message) from None
        messages.error(request, exc.message)
        return HttpResponseRedirect(reverse("runs:detail", args=[run.id]))
    return HttpResponseRedirect(f"{reverse('playground')}?{urlencode({'run': str(new.id)})}")


def _input_guardrails(team: Any) -> list[str]:
    """``guardrails.input.<check>`` of every enabled input check of the team's policy in force."""
    try:
        checks = integration.policy_in_force(team).effective.spec.guardrails.input
    except ValueError:
        return ["guardrails.input (the policy no longer validates)"]  # assume the strictest
    return [
        f"guardrails.input.{name}"
        for name in type(checks).model_fields  # the spec sections are pydantic models
        if getattr(getattr(checks, name), "enabled", False)
    ]


def _last_user_message(msgs: list[dict[str, str]]) -> str:
    users = [m.get("content", "") for m in msgs if isinstance(m, dict) and m.get("role") == "user"]
    return (users[-1] if users else "")[:2000] or "(replay)"


@require_POST
def plan_decide(request: HttpRequest, run_id: str) -> HttpResponse:
    """Approve or refuse a plan held for an approver (apps.runs.approvals)."""
    run = selectors.run_get_visible(user=request.user, run_id=run_id)
    if run is None:
        raise Http404("No such run.")
    decision = request.POST.get("decision", "")
    note = request.POST.get("note", "")
    wants_json = "application/json" in request.headers.get("Accept", "")
    try:
        approvals.check_may_decide(request.user, run)
        if decision == "approve":
            run = approvals.plan_approve(actor=request.user, run=run, note=note)
        elif decision == "reject":
            run = approvals.plan_reject(actor=request.user, run=run, note=note)
        else:
            raise approvals.ApprovalError("decision: 'approve' or 'reject'.", rule="decision", status=400)
    except approvals.ApprovalError as exc:
        if exc.status == 403:
            raise PermissionDenied(str(exc)) from None
        if wants_json:
            return JsonResponse({"error": str(exc), "rule": exc.rule}, status=exc.status)
        messages.error(request, str(exc))
        return HttpResponseRedirect(reverse("runs:detail", args=[run.id]))
    if wants_json:
        return JsonResponse({"id": str(run.id), "status": run.status})
    held = run.approvals.filter(decided_by=request.user).order_by("-decided_at").first()
    if held is not None and held.kind == "tool":
        done = (
            "approved: the run resumes and makes the call"
            if decision == "approve"
            else ("refused: the run resumes and the call is refused (tools.approval_rejected)")
        )
        messages.success(request, f"Tool call {done}.")
        return HttpResponseRedirect(_safe_next(request, reverse("runs:detail", args=[run.id])))
    done = "approved: the run resumes" if decision == "approve" else "refused: the run ended blocked"
    messages.success(request, f"Plan {done}.")
    return HttpResponseRedirect(_safe_next(request, reverse("runs:detail", args=[run.id])))
