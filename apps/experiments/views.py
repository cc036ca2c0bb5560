"""/experiments/ pages: thin — forms validate, services write, selectors compute the table."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from apps.core.types import Viewer
from apps.experiments import selectors, services
from apps.experiments.forms import DatasetUploadForm, ExperimentForm
from apps.experiments.models import Experiment
from apps.governance import selectors as gov
from apps.governance.models import Team
from apps.learning.services import RouterError
from apps.policies.models import PolicyVersion
from apps.runs.selectors import run_content_visible


def _experiment_for(user: Viewer, pk: int) -> Experiment:
    experiment = get_object_or_404(Experiment.objects.select_related("team", "dataset", "pool"), pk=pk)
    if not gov.can_view_team(user, experiment.team):
        raise Http404("No such experiment.")  # other teams' experiments are not revealed
    if not gov.can_run_on_team(user, experiment.team):
        raise PermissionDenied(
            f"You may not see experiments of team '{experiment.team.slug}': it needs {services.RUN_PERMISSION}."
        )
    return experiment


def _page(
    request: HttpRequest, upload: DatasetUploadForm, start: ExperimentForm, status: int = 200
) -> HttpResponse:
    return render(
        request,
        "experiments/list.html",
        {
            "experiments": selectors.experiments_visible_to(request.user)[:50],
            "datasets": selectors.datasets_visible_to(request.user)[:50],
            "upload_form": upload,
            "form": start,
            "can_run": gov.teams_runnable_by(request.user).exists(),
            "run_permission": services.RUN_PERMISSION,
        },
        status=status,
    )


@require_http_methods(["GET", "POST"])
def experiment_list(request: HttpRequest) -> HttpResponse:
    """The team's experiments, and the forms to upload a set and start an experiment."""
    upload = DatasetUploadForm(user=request.user)
    form = ExperimentForm(user=request.user)
    if request.method == "POST":
        form = ExperimentForm(request.POST, user=request.user)
        if form.is_valid():
            c = form.cleaned_data
            try:
                experiment = services.experiment_start(
                    actor=request.user,
                    dataset=c["dataset"],
                    pool=c["pool"],
                    arms=c["arms"],
                    evaluator=c["evaluator"],
                    seed=c["seed"],
                    judge_pool=c["judge_pool"],
                    judge_worker=c["judge_worker"],
                    rubric=c.get("rubric") or "",
                )
            except PermissionError as err:
                raise PermissionDenied(str(err)) from None
            except services.ExperimentError as err:
                form.add_error(err.field if err.field in form.fields else None, str(err))
            else:
                return redirect("experiments:detail", pk=experiment.pk)
        return _page(request, upload, form, status=400)
    return _page(request, upload, form)


@require_POST
def dataset_upload(request: HttpRequest) -> HttpResponse:
    upload = DatasetUploadForm(request.POST, request.FILES, user=request.user)
    if upload.is_valid():
        try:
            dataset = services.dataset_upload(
                actor=request.user,
                team=upload.cleaned_data["team"],
                name=upload.cleaned_data["name"],
                items=upload.items,
            )
        except PermissionError as err:
            raise PermissionDenied(str(err)) from None
        except services.ExperimentError as err:
            upload.add_error(err.field if err.field in upload.fields else None, str(err))
        else:
            messages.success(request, f"Dataset “{dataset.name}” uploaded: {dataset.row_count} questions.")
            return redirect("experiments:list")
    return _page(request, upload, ExperimentForm(user=request.user), status=400)


def experiment_detail(request: HttpRequest, pk: int) -> HttpResponse:
    experiment = _experiment_for(request.user, pk)
    services.experiment_refresh(experiment)
    experiment.refresh_from_db()
    data = selectors.results(experiment)
    try:
        page = int(request.GET.get("page") or 1)
    except ValueError:
        page = 1
    return render(
        request,
        "experiments/detail.html",
        {
            "experiment": experiment,
            "questions": selectors.questions_page(experiment, page),
            "progress": selectors.progress(experiment),
            "data": data,
            "scatter_json": data["scatter"],
            "can_teach": gov.can_manage_team(request.user, experiment.team),
            # By its number, as the policy editor shows it, never the database id (issue 42).
            "policy_version_number": PolicyVersion.objects.filter(pk=experiment.policy_version_id_at_start)
            .values_list("number", flat=True)
            .first(),
        },
    )


def experiment_question(request: HttpRequest, pk: int, index: int) -> HttpResponse:
    """One question through every strategy: answers, scores, latency, cost and the runs."""
    experiment = _experiment_for(request.user, pk)
    detail = selectors.question_detail(
        experiment, index, content_visible=lambda run: run_content_visible(user=request.user, run=run)
    )
    if detail is None:
        raise Http404(f"The dataset has no line {index}.")
    return render(request, "experiments/question.html", {"experiment": experiment, **detail})


def experiment_progress(request: HttpRequest, pk: int) -> JsonResponse:
    """Polled every second by the detail page while the experiment runs."""
    experiment = _experiment_for(request.user, pk)
    if not experiment.is_terminal:
        services.experiment_refresh(experiment)
        experiment.refresh_from_db()
    return JsonResponse(selectors.progress(experiment))


@require_POST
def experiment_cancel(request: HttpRequest, pk: int) -> HttpResponse:
    experiment = _experiment_for(request.user, pk)
    try:
        services.experiment_cancel(actor=request.user, experiment=experiment)
    except PermissionError as err:
        raise PermissionDenied(str(err)) from None
    messages.success(request, "Experiment cancelled: its unfinished runs were cancelled.")
    return redirect("experiments:detail", pk=experiment.pk)


@require_POST
def experiment_teach(request: HttpRequest, pk: int) -> HttpResponse:
    experiment = _experiment_for(request.user, pk)
    try:
        result = services.experiment_teach(actor=request.user, experiment=experiment)
    except PermissionError as err:
        raise PermissionDenied(str(err)) from None
    except (services.ExperimentError, RouterError) as err:
        messages.error(request, str(err))
    else:
        messages.success(
            request,
            f"The learned router learned from {result.learned} result{'s' if result.learned != 1 else ''}"
            f" ({result.skipped} without a score skipped).",
        )
    return redirect("experiments:detail", pk=experiment.pk)


def training_export(request: HttpRequest, team_slug: str) -> HttpResponse:
    """``?kind=conductor|chat``: the team's training export as a JSONL download (team admins)."""

    team = Team.objects.filter(slug=team_slug).first()
    if team is None or not gov.can_view_team(request.user, team):
        raise Http404("No such team.")
    kind = request.GET.get("kind", "conductor")
    try:
        lines, summary = services.training_export(actor=request.user, team=team, kind=kind)
    except PermissionError as err:
        raise PermissionDenied(str(err)) from None
    except services.ExperimentError as err:
        return HttpResponse(str(err), status=400, content_type="text/plain; charset=utf-8")
    response = HttpResponse("".join(lines), content_type="application/x-ndjson; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{team.slug}-{kind}-training.jsonl"'
    response["X-Export-Rows"] = str(summary["rows"])
    response["X-Export-Skipped"] = ", ".join(f"{k}: {v}" for k, v in summary["skipped"].items()) or "none"
    response["Cache-Control"] = "no-store"
    return response
