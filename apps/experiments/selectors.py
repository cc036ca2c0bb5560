"""Reads for experiments: visibility (through the governance selectors) and the results table."""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from django.db.models import QuerySet

from apps.core.types import Viewer
from apps.experiments.models import Dataset, DatasetItem, Experiment, ExperimentRun
from apps.governance import selectors as gov
from apps.runs.models import strategy_name

QUESTION_PREVIEW_CHARS = 160
MAX_DISAGREEMENTS = 200


def experiments_visible_to(user: Viewer) -> QuerySet[Experiment]:
    """Experiments of the teams the user may run on (members who may run; never reviewers only)."""
    return Experiment.objects.filter(team__in=gov.teams_runnable_by(user)).select_related(
        "team", "dataset", "pool", "created_by"
    )


def datasets_visible_to(user: Viewer) -> QuerySet[Dataset]:
    return Dataset.objects.filter(team__in=gov.teams_runnable_by(user)).select_related("team")


def progress(experiment: Experiment) -> dict[str, Any]:
    rows = ExperimentRun.objects.filter(experiment=experiment)
    total = rows.count()
    done = rows.filter(scored_at__isnull=False).count()
    return {
        "id": experiment.pk,
        "status": experiment.status,
        "done": done,
        "total": total,
        "percent": round(100 * done / total) if total else 100,
        "terminal": experiment.is_terminal,
    }


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _arm_stats(rows: list[ExperimentRun]) -> dict[str, Any]:
    scores = [r.score for r in rows if r.score is not None]
    done = [r for r in rows if r.scored_at is not None]
    costs = [float(r.cost_usd) for r in done if r.cost_usd is not None]
    latencies = [r.latency_ms for r in done if r.latency_ms is not None and r.status == "succeeded"]
    tokens = [r.tokens for r in done if r.tokens is not None]
    return {
        "n": len(rows),
        "done": len(done),
        "succeeded": sum(1 for r in done if r.status == "succeeded"),
        # answers held for review: not scored until released (issue 39)
        "held": sum(1 for r in done if r.status == "held"),
        "scored": len(scores),
        "accuracy": _mean(scores),
        "tokens_mean": _mean([float(t) for t in tokens]),
        "tokens_total": sum(tokens),
        # cost is only known when every finished run of the arm was priced
        "cost_total": sum(costs) if done and len(costs) == len(done) else None,
        "cost_mean": _mean(costs) if done and len(costs) == len(done) else None,
        "latency_p50_ms": statistics.median(latencies) if latencies else None,
    }


def results(experiment: Experiment) -> dict[str, Any]:
    """The seed paper's Table 1 for this pool: per arm, per tag, the scatter and disagreements."""
    rows = list(
        ExperimentRun.objects.filter(experiment=experiment)
        .select_related("item")
        .order_by("item__index", "arm")
    )
    arms = list(experiment.arms)
    by_arm: dict[str, list[ExperimentRun]] = defaultdict(list)
    by_tag_arm: dict[tuple[str, str], list[ExperimentRun]] = defaultdict(list)
    by_item: dict[int, list[ExperimentRun]] = defaultdict(list)
    for r in rows:
        by_arm[r.arm].append(r)
        for tag in r.item.tags or []:
            by_tag_arm[(tag, r.arm)].append(r)
        by_item[r.item.index].append(r)

    table = [{"arm": arm, **_arm_stats(by_arm.get(arm, []))} for arm in arms]
    tags = sorted({t for (t, _a) in by_tag_arm})
    tag_table = [
        {
            "tag": tag,
            "cells": [
                {
                    "arm": arm,
                    "accuracy": _mean([r.score for r in by_tag_arm[(tag, arm)] if r.score is not None]),
                }
                for arm in arms
            ],
        }
        for tag in tags
    ]

    disagreements: list[dict[str, Any]] = []
    for index, item_rows in by_item.items():
        scores = {r.arm: r.score for r in item_rows}
        known = {s for s in scores.values() if s is not None}
        if len(known) > 1:
            item = item_rows[0].item
            q = item.question
            disagreements.append(
                {
                    "index": index,
                    "question": q if len(q) <= QUESTION_PREVIEW_CHARS else q[:QUESTION_PREVIEW_CHARS] + "…",
                    "reference": item.reference,
                    "tags": item.tags,
                    "cells": [
                        {
                            "arm": arm,
                            "score": scores.get(arm),
                            "run_id": next((r.run_id for r in item_rows if r.arm == arm), None),
                        }
                        for arm in arms
                    ],
                }
            )
        if len(disagreements) >= MAX_DISAGREEMENTS:
            break
    return {
        "arms": arms,
        "table": table,
        "tags": tag_table,
        "scatter": scatter(table),
        "disagreements": disagreements,
    }


QUESTIONS_PER_PAGE = 50


def _preview(text: str) -> str:
    return text if len(text) <= QUESTION_PREVIEW_CHARS else text[:QUESTION_PREVIEW_CHARS] + "…"


def questions_page(experiment: Experiment, page: int) -> dict[str, Any]:
    """Every question of the experiment (not only where strategies disagree), a page at a time:
    each strategy's score and a link to the question's drill-down (issue 42)."""
    items = list(experiment.dataset.items.order_by("index").values_list("pk", "index", "messages"))
    pages = max(1, -(-len(items) // QUESTIONS_PER_PAGE))
    page = min(max(1, page), pages)
    chunk = items[(page - 1) * QUESTIONS_PER_PAGE : page * QUESTIONS_PER_PAGE]
    arms = list(experiment.arms)
    scores: dict[tuple[int, str], ExperimentRun] = {
        (r.item_id, r.arm): r
        for r in ExperimentRun.objects.filter(experiment=experiment, item_id__in=[pk for pk, _i, _m in chunk])
    }
    rows = []
    for pk, index, messages in chunk:
        item = DatasetItem(pk=pk, index=index, messages=messages)
        rows.append(
            {
                "index": index,
                "question": _preview(item.question),
                "cells": [{"arm": arm, "row": scores.get((pk, arm))} for arm in arms],
            }
        )
    return {"rows": rows, "page": page, "pages": pages, "total": len(items)}


def question_detail(experiment: Experiment, index: int, *, content_visible: Any) -> dict[str, Any] | None:
    """One question through every strategy: answer (when the viewer may see it), score and why,
    latency, cost, tokens and the run. ``content_visible(run) -> bool`` is the held-answer rule."""
    item = experiment.dataset.items.filter(index=index).first()
    if item is None:
        return None
    by_arm = {
        r.arm: r for r in ExperimentRun.objects.filter(experiment=experiment, item=item).select_related("run")
    }
    cells = []
    for arm in experiment.arms:
        row = by_arm.get(arm)
        run = row.run if row is not None else None
        visible = run is not None and content_visible(run)
        cells.append(
            {
                "arm": arm,
                "row": row,
                "run": run,
                "answer": (run.answer if visible else None) if run is not None else None,
                "withheld": run is not None and not visible,
            }
        )
    indexes = list(experiment.dataset.items.order_by("index").values_list("index", flat=True))
    at = indexes.index(index)
    return {
        "item": item,
        "cells": cells,
        "previous": indexes[at - 1] if at > 0 else None,
        "next": indexes[at + 1] if at + 1 < len(indexes) else None,
        "page": at // QUESTIONS_PER_PAGE + 1,
    }


def scatter(table: list[dict[str, Any]]) -> dict[str, Any]:
    """Plotly figure: accuracy against mean cost per question (tokens when the pool is unpriced)."""
    points = [row for row in table if row["accuracy"] is not None]
    priced = bool(points) and all(row["cost_mean"] is not None for row in points)
    x_key, x_title = (
        ("cost_mean", "mean cost per question (USD)")
        if priced
        else (
            "tokens_mean",
            "mean tokens per question (the pool is unpriced)",
        )
    )
    return {
        "id": "accuracy-cost",
        "empty": not points,
        "x_is_cost": priced,
        "data": [
            {
                "type": "scatter",
                "mode": "markers+text",
                "name": strategy_name(row["arm"]),
                "x": [row[x_key] or 0],
                "y": [round(100 * row["accuracy"], 2)],
                "text": [strategy_name(row["arm"])],
                "textposition": "top center",
                "marker": {"size": 12},
                "hovertemplate": f"{strategy_name(row['arm'])}: %{{y}} % at %{{x}}<extra></extra>",
            }
            for row in points
        ],
        "layout": {
            "xaxis": {"title": {"text": x_title}, "rangemode": "tozero"},
            "yaxis": {"title": {"text": "accuracy (%)"}, "range": [-5, 105]},
            "showlegend": False,
        },
    }
