"""Reads for /insights/: every number comes from the rollups (and the range's RunReview rows) of
the teams whose runs the viewer may see (``apps.governance.selectors.teams_with_runs_visible_to``:
a member sees their teams, a platform admin all)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from django.db.models import Count, QuerySet, Sum
from django.urls import reverse

from apps.core.types import Viewer, stored_user
from apps.governance import selectors as gov
from apps.governance.models import Team
from apps.insights.models import (
    DAY,
    HOUR,
    RUN_ROW,
    BudgetNotice,
    GuardrailRollup,
    HistogramRollup,
    ReviewFact,
    ReviewRollup,
    Rollup,
)
from apps.policies.services import effective_policy
from apps.runs.models import strategy_name
from apps.workers.models import Pool, Worker


@dataclass(frozen=True, slots=True)
class Scope:
    team_ids: list[int]
    start: datetime
    end: datetime
    team: str = ""
    pool: str = ""
    worker: str = ""
    strategy: str = ""

    @property
    def by_day(self) -> bool:
        return self.end - self.start > timedelta(hours=48)

    @property
    def bar_ms(self) -> int:
        """A bar as wide as its bucket (on a date axis plotly would draw a lone bar a hairline)."""
        return int(0.9 * (86_400_000 if self.by_day else 3_600_000))

    def time_axis(self) -> dict[str, Any]:
        """The whole range on the axis (a lone bar otherwise zooms to milliseconds)."""
        return {"type": "date", "range": [self.start.isoformat(), self.end.isoformat()]}

    def drill(self, **extra: str) -> str:
        """The runs list filtered to one bar or point (its GET filters work by day)."""
        query = {
            "team": extra.get("team", self.team),
            "strategy": extra.get("strategy", self.strategy),
            "worker": extra.get("worker", self.worker),
            "date_from": extra.get("date_from", f"{self.start:%Y-%m-%d}"),
            "date_to": extra.get("date_to", f"{self.end - timedelta(seconds=1):%Y-%m-%d}"),
            "status": extra.get("status", ""),
        }
        return reverse("runs:list") + "?" + urlencode({k: v for k, v in query.items() if v})


def notices_for(user: Viewer, *, limit: int = 10) -> list[BudgetNotice]:
    """The viewer's own budget notices (only team admins get them), newest first."""
    if (owner := stored_user(user)) is None:  # anonymous: nobody's notices
        return []
    return list(BudgetNotice.objects.filter(user=owner).select_related("alert__team")[:limit])


def visible_team_slugs(user: Viewer) -> list[str]:
    return list(gov.teams_with_runs_visible_to(user).order_by("slug").values_list("slug", flat=True))


def visible_pool_slugs(user: Viewer) -> list[str]:
    team_ids = gov.teams_with_runs_visible_to(user).values("pk")
    pool_ids = Rollup.objects.filter(team_id__in=team_ids, grain=DAY).values("pool_id").distinct()
    return list(Pool.objects.filter(pk__in=pool_ids).order_by("slug").values_list("slug", flat=True))


def visible_worker_keys(user: Viewer) -> list[str]:
    """Workers that have steps in the viewer's teams' rollups (the Worker filter's choices)."""
    team_ids = gov.teams_with_runs_visible_to(user).values("pk")
    return list(
        Rollup.objects.filter(team_id__in=team_ids, grain=DAY)
        .exclude(worker_key=RUN_ROW)
        .values_list("worker_key", flat=True)
        .distinct()
        .order_by("worker_key")
    )


def scope_for(*, user: Viewer, start: datetime, end: datetime, filters: dict[str, Any]) -> Scope:
    teams = gov.teams_with_runs_visible_to(user)
    if filters.get("team"):
        teams = teams.filter(slug=filters["team"])
    return Scope(
        team_ids=list(teams.values_list("pk", flat=True)),
        start=start,
        end=end,
        team=filters.get("team") or "",
        pool=filters.get("pool") or "",
        worker=filters.get("worker") or "",
        strategy=filters.get("strategy") or "",
    )


def _rows(model: Any, scope: Scope, *, worker: bool | None = None) -> QuerySet[Any]:
    """Rollup rows of the scope. worker=False: run rows; True: worker rows (worker filter applies)."""
    qs = model.objects.filter(
        team_id__in=scope.team_ids,
        grain=DAY if scope.by_day else HOUR,
        hour__gte=scope.start,
        hour__lt=scope.end,
    )
    if scope.pool:
        qs = qs.filter(pool__slug=scope.pool)
    if scope.strategy:
        qs = qs.filter(strategy=scope.strategy)
    if worker is False:
        qs = qs.filter(worker_key=RUN_ROW)
    elif worker is True:
        qs = qs.exclude(worker_key=RUN_ROW)
        if scope.worker:
            qs = qs.filter(worker_key=scope.worker)
    return qs


def percentile(hist: dict[float, int], q: float) -> float | None:
    """Estimate from bucketed counts: the upper bound of the bucket holding the q-th observation
    (the open last bucket reports its lower bound)."""
    total = sum(hist.values())
    if not total:
        return None
    rank = q * total
    seen = 0
    bounds = sorted(hist)
    for i, bound in enumerate(bounds):
        seen += hist[bound]
        if seen >= rank:
            if bound == float("inf"):
                return bounds[i - 1] if i else None
            return bound
    return bounds[-1]


def _f(value: Decimal | float | int | None) -> float:
    return float(value or 0)


def _day(d: datetime) -> str:
    return f"{d:%Y-%m-%d}"


def _has_data(trace: dict[str, Any]) -> bool:
    """A trace draws something: a value that is a number other than 0 (all-zero or all-None bars
    would make plotly draw bare axes from -1 to 1, issue 42)."""
    axis = "x" if trace.get("orientation") == "h" else "y"
    values = trace.get(axis) if trace.get(axis) is not None else trace.get("values")
    return any(isinstance(v, int | float) and v != 0 for v in values or [])


def _chart(
    cid: str,
    title: str,
    caption: str,
    data: list[dict[str, Any]],
    *,
    empty_note: str = "No data in this range.",
    **layout: Any,
) -> dict[str, Any]:
    # Overlays (a budget line) draw nothing on their own: they never make a chart non-empty.
    empty = not any(_has_data(t) for t in data if not t.get("overlay"))
    for t in data:
        t.pop("overlay", None)
    return {
        "id": cid,
        "title": title,
        "caption": caption,
        "empty": empty,
        "empty_note": empty_note,
        "data": data,
        "layout": layout,
    }


# --- the charts -------------------------------------------------------------------------------------


def daily_budgets(scope: Scope) -> dict[str, Decimal]:
    """Each team's daily limit in force now (hard, else soft); teams without one are left out."""

    out = {}
    for team in Team.objects.filter(pk__in=scope.team_ids).order_by("slug"):
        daily = effective_policy(team).spec.budgets.daily
        limit = daily.hard_usd if daily.hard_usd is not None else daily.soft_usd
        if limit is not None:
            out[team.slug] = limit
    return out


def spend_chart(scope: Scope) -> dict[str, Any]:
    series: dict[str, dict[datetime, float]] = defaultdict(lambda: defaultdict(float))
    for row in _rows(Rollup, scope, worker=False).values("team__slug", "hour").annotate(c=Sum("cost_usd")):
        series[row["team__slug"]][row["hour"]] += _f(row["c"])
    data = []
    for team, points in sorted(series.items()):
        xs = sorted(points)
        data.append(
            {
                "type": "bar",
                "name": team,
                "x": [x.isoformat() for x in xs],
                "y": [round(points[x], 8) for x in xs],
                "customdata": [scope.drill(team=team, date_from=_day(x), date_to=_day(x)) for x in xs],
                "width": [scope.bar_ms] * len(xs),
                "hovertemplate": "%{x}<br>$%{y:.6f}<extra>" + team + "</extra>",
            }
        )
    if scope.by_day and series:
        # Daily budgets: one bar is one budget period, so the limit is a line across the bars.
        first, last = min(min(p) for p in series.values()), max(max(p) for p in series.values())
        for team, limit in daily_budgets(scope).items():
            line: dict[str, Any] = {
                "type": "scatter",
                "mode": "lines",
                "name": f"{team} daily budget",
                "x": [first.isoformat(), last.isoformat()],
                "y": [float(limit), float(limit)],
                "line": {"dash": "dash"},
                "customdata": [scope.drill(team=team), scope.drill(team=team)],
                "overlay": True,
            }
            data.append(line)
    return _chart(
        "spend",
        "Spend over time per team",
        "What did each team spend, per "
        + ("day, against its daily budget (dashed; resets 00:00 UTC)?" if scope.by_day else "hour?"),
        data,
        empty_note="No spend in this range: no runs, or only runs on unpriced workers ($0).",
        barmode="stack",
        xaxis=scope.time_axis(),
        yaxis={"title": "USD"},
    )


def orchestration_chart(scope: Scope) -> dict[str, Any]:
    rows = (
        _rows(Rollup, scope, worker=False)
        .values("strategy")
        .annotate(
            oc=Sum("orch_cost_usd"),
            c=Sum("cost_usd"),
            oi=Sum("orch_input_tokens"),
            oo=Sum("orch_output_tokens"),
            ti=Sum("input_tokens"),
            to=Sum("output_tokens"),
        )
        .order_by("strategy")
    )
    strategies, orch_tokens, work_tokens, links = [], [], [], []
    for r in rows:
        strategies.append(strategy_name(r["strategy"]))
        orch = int(r["oi"] or 0) + int(r["oo"] or 0)
        orch_tokens.append(orch)
        # Run totals include planning: the worker share is what is left.
        work_tokens.append(max(0, int(r["ti"] or 0) + int(r["to"] or 0) - orch))
        links.append(scope.drill(strategy=r["strategy"]))
    data = [
        {
            "type": "bar",
            "name": "orchestration (planning)",
            "x": strategies,
            "y": orch_tokens,
            "customdata": links,
        },
        {"type": "bar", "name": "worker work", "x": strategies, "y": work_tokens, "customdata": links},
    ]
    return _chart(
        "orchestration",
        "Orchestration vs worker tokens per strategy",
        "How much of the tokens does planning cost against the work itself?",
        data,
        barmode="stack",
        xaxis={"automargin": True},
        yaxis={"title": "tokens"},
    )


def _hist(qs: QuerySet[Any], key: str) -> dict[str, dict[float, int]]:
    out: dict[str, dict[float, int]] = defaultdict(dict)
    for row in qs.values(key, "bucket").annotate(n=Sum("count")):
        out[row[key]][row["bucket"]] = int(row["n"])
    return out


def run_latency(scope: Scope) -> dict[str, dict[float, int]]:
    """Run latency histograms per strategy (the latency chart and the strategy table share it)."""
    return _hist(_rows(HistogramRollup, scope, worker=False).filter(metric="latency"), "strategy")


def latency_chart(scope: Scope, run_lat: dict[str, dict[float, int]] | None = None) -> dict[str, Any]:
    latency = _rows(HistogramRollup, scope).filter(metric="latency")
    workers = _hist(
        latency.exclude(worker_key=RUN_ROW).filter(**({"worker_key": scope.worker} if scope.worker else {})),
        "worker_key",
    )
    strategies = run_lat if run_lat is not None else run_latency(scope)
    labels, p50, p95, links = [], [], [], []
    for name, hist in sorted(workers.items()):
        labels.append(f"worker · {name}")
        p50.append(percentile(hist, 0.5))
        p95.append(percentile(hist, 0.95))
        links.append(scope.drill(worker=name))
    for name, hist in sorted(strategies.items()):
        labels.append(f"run · {strategy_name(name)}")
        p50.append(percentile(hist, 0.5))
        p95.append(percentile(hist, 0.95))
        links.append(scope.drill(strategy=name))
    # Time to first token of streamed runs, per strategy (None on the worker bars).
    ttft = _hist(_rows(HistogramRollup, scope, worker=False).filter(metric="ttft"), "strategy")
    ttft_p50 = [None] * len(workers) + [percentile(ttft.get(name, {}), 0.5) for name in sorted(strategies)]
    # Horizontal bars: each label on one line to the left of its bars, grown to fit (automargin),
    # never slanted under the axis and cut at a phone's width (issue 42).
    data = [
        {"type": "bar", "orientation": "h", "name": name, "y": labels, "x": values, "customdata": links}
        for name, values in (("p50", p50), ("p95", p95), ("first token p50", ttft_p50))
    ]
    return _chart(
        "latency",
        "Latency p50 / p95 per worker and per strategy; time to first token",
        "Which worker or strategy is slow, and how soon do streamed runs show a first token? "
        "(bucketed estimate, ms)",
        data,
        barmode="group",
        yaxis={"automargin": True, "autorange": "reversed"},
        xaxis={"title": "ms"},
        height=max(300, 70 + 60 * len(labels)),
    )


def guardrail_chart(scope: Scope) -> dict[str, Any]:
    series: dict[str, dict[datetime, int]] = defaultdict(lambda: defaultdict(int))
    rows = (
        _rows(GuardrailRollup, scope)
        .exclude(status="not_run")
        .values("rule", "status", "action", "hour")
        .annotate(n=Sum("count"))
    )
    for r in rows:
        # What happened: the action when the check intervened, "failed check" when it broke.
        outcome = {"intervened": r["action"] or "intervened", "failed": "failed check"}.get(
            r["status"], r["status"]
        )
        series[f"{r['rule']}: {outcome}"][r["hour"]] += int(r["n"])
    data = []
    for name, points in sorted(series.items()):
        xs = sorted(points)
        data.append(
            {
                "type": "bar",
                "name": name,
                "x": [x.isoformat() for x in xs],
                "y": [points[x] for x in xs],
                "customdata": [scope.drill(date_from=_day(x), date_to=_day(x)) for x in xs],
                "width": [scope.bar_ms] * len(xs),
            }
        )
    return _chart(
        "guardrails",
        "Guardrail outcomes over time",
        "How often does each rule pass, block, redact, warn, ask for review or fail to run?",
        data,
        barmode="stack",
        xaxis=scope.time_axis(),
        yaxis={"title": "checks"},
    )


def plan_chart(scope: Scope) -> tuple[dict[str, Any], dict[str, Any]]:
    hists = _hist(_rows(HistogramRollup, scope, worker=False).filter(metric__in=["steps", "depth"]), "metric")
    steps = hists.get("steps", {})
    depth = hists.get("depth", {})
    xs = sorted(steps)
    data: list[dict[str, Any]] = [
        {
            "type": "bar",
            "name": "runs",
            "x": [int(x) for x in xs],
            "y": [steps[x] for x in xs],
            "customdata": [scope.drill() for _ in xs],
        }
    ]
    totals = _rows(Rollup, scope, worker=False).aggregate(
        runs=Sum("runs"), repairs=Sum("repairs"), fallbacks=Sum("fallbacks"), blocked=Sum("plans_blocked")
    )
    runs = int(totals["runs"] or 0)

    def rate(n: Any) -> float | None:
        return round(100 * int(n or 0) / runs, 1) if runs else None

    shape = {
        "runs": runs,
        "repair_rate": rate(totals["repairs"]),
        "fallback_rate": rate(totals["fallbacks"]),
        "block_rate": rate(totals["blocked"]),
        "depth": {int(k): v for k, v in sorted(depth.items())},
    }
    chart = _chart(
        "plans",
        "Plan shapes: steps per run",
        "How big are the plans the conductor writes?",
        data,
        xaxis={"title": "steps", "dtick": 1},
        yaxis={"title": "runs"},
    )
    return chart, shape


SIGNOFF_SAMPLE = 5000  # sign-off waits: the median of the newest this many


def review_chart(user: Viewer, scope: Scope) -> tuple[dict[str, Any], dict[str, Any]]:
    # Runs created in the range by review state now (ReviewRollup follows every verdict).
    waiting = {
        name: int(n or 0)
        for name, n in _rows(ReviewRollup, scope)
        .aggregate(pending=Sum("pending"), held=Sum("held"), flagged=Sum("flagged"))
        .items()
    }
    # ReviewFact: the reviews of the range by the (team, created_at) index, one row per RunReview.
    reviews = ReviewFact.objects.filter(
        team_id__in=scope.team_ids,
        created_at__gte=scope.start,
        created_at__lt=scope.end,
    )
    per: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in reviews.values("reviewer_label", "status").annotate(n=Count("pk")).order_by():
        per[r["reviewer_label"]][r["status"]] = int(r["n"])
    # The newest 5,000 sign-offs of finished runs (RunReview's own order: newest first). The run's
    # end is on the fact; only reviews made before their run ended read it from the run.
    newest = ("-created_at", "-review_id")
    stored = reviews.filter(run_finished_at__isnull=False).order_by(*newest)
    late = reviews.filter(run_finished_at__isnull=True, run__finished_at__isnull=False).order_by(*newest)
    signed = sorted(
        [
            *stored.values_list("created_at", "review_id", "run_finished_at")[:SIGNOFF_SAMPLE],
            *late.values_list("created_at", "review_id", "run__finished_at")[:SIGNOFF_SAMPLE],
        ],
        reverse=True,
    )[:SIGNOFF_SAMPLE]
    waits = [
        (reviewed_at - finished_at).total_seconds()
        for reviewed_at, _pk, finished_at in signed
        if finished_at is not None
    ]
    waits.sort()
    reviewers = sorted(per)
    data = [
        {
            "type": "bar",
            "name": status,
            "x": reviewers,
            "y": [per[name].get(status, 0) for name in reviewers],
            "customdata": [scope.drill() for _ in reviewers],
        }
        for status in ("approved", "flagged", "needs_follow_up")
    ]
    summary = {
        **waiting,
        "signoff_p50_s": waits[len(waits) // 2] if waits else None,
        "signoff_count": len(waits),
    }
    chart = _chart(
        "reviews",
        "Reviews per reviewer",
        "Who signs off, who flags, and how long do runs wait?",
        data,
        barmode="stack",
        xaxis={"automargin": True},
        yaxis={"title": "reviews"},
    )
    return chart, summary


def strategy_table(
    user: Viewer, scope: Scope, run_lat: dict[str, dict[float, int]] | None = None
) -> list[dict[str, Any]]:
    rows = {
        r["strategy"]: r
        for r in _rows(Rollup, scope, worker=False)
        .values("strategy")
        .annotate(
            runs=Sum("runs"),
            ok=Sum("succeeded"),
            c=Sum("cost_usd"),
            ls=Sum("latency_ms_sum"),
            lc=Sum("latency_count"),
        )
    }
    reviewed = {
        r["strategy"]: {"approved": int(r["a"] or 0), "decided": int(r["a"] or 0) + int(r["f"] or 0)}
        for r in _rows(ReviewRollup, scope).values("strategy").annotate(a=Sum("approved"), f=Sum("flagged"))
    }
    lat = run_lat if run_lat is not None else run_latency(scope)
    table = []
    for strategy in sorted(rows):
        r = rows[strategy]
        runs = int(r["runs"] or 0)
        rv: dict[str, Any] = dict(reviewed.get(strategy) or {})
        table.append(
            {
                "strategy": strategy,
                "name": strategy_name(strategy),
                "runs": runs,
                "success_rate": round(100 * int(r["ok"] or 0) / runs, 1) if runs else None,
                "approval_rate": round(100 * rv["approved"] / rv["decided"], 1)
                if rv.get("decided")
                else None,
                "cost": _f(r["c"]),
                "cost_per_run": _f(r["c"]) / runs if runs else None,
                "latency_avg_ms": _f(r["ls"]) / int(r["lc"]) if r["lc"] else None,
                "latency_p50_ms": percentile(lat.get(strategy, {}), 0.5),
                "link": scope.drill(strategy=strategy),
            }
        )
    return table


def spend_per_model(scope: Scope) -> list[dict[str, Any]]:
    """Spend of the range per provider model: the workers' steps (from the worker rollups, each
    worker by the model it names now), and the conductors' planning as its own row."""
    per_worker = (
        _rows(Rollup, scope, worker=True)
        .values("worker_key")
        .annotate(c=Sum("cost_usd"), st=Sum("steps"), ti=Sum("input_tokens"), to=Sum("output_tokens"))
    )
    models = dict(
        Worker.objects.filter(slug__in=[r["worker_key"] for r in per_worker]).values_list(
            "slug", "model_name"
        )
    )
    rows: dict[str, dict[str, Any]] = {}
    for r in per_worker:
        model = models.get(r["worker_key"]) or f"(worker {r['worker_key']} removed)"
        row = rows.setdefault(model, {"model": model, "workers": set(), "steps": 0, "tokens": 0, "cost": 0.0})
        row["workers"].add(r["worker_key"])
        row["steps"] += int(r["st"] or 0)
        row["tokens"] += int(r["ti"] or 0) + int(r["to"] or 0)
        row["cost"] += _f(r["c"])
    planning = _rows(Rollup, scope, worker=False).aggregate(
        c=Sum("orch_cost_usd"), ti=Sum("orch_input_tokens"), to=Sum("orch_output_tokens")
    )
    out = sorted(rows.values(), key=lambda r: (-r["cost"], r["model"]))
    for row in out:
        row["workers"] = ", ".join(sorted(row["workers"]))
    planning_tokens = int(planning["ti"] or 0) + int(planning["to"] or 0)
    if planning_tokens or planning["c"]:
        out.append(
            {
                "model": "conductor planning",
                "workers": "the pools' conductors",
                "steps": None,
                "tokens": planning_tokens,
                "cost": _f(planning["c"]),
            }
        )
    return out


def insights(*, user: Viewer, scope: Scope) -> dict[str, Any]:
    plans, shape = plan_chart(scope)
    reviews, review_summary = review_chart(user, scope)
    totals = _rows(Rollup, scope, worker=False).aggregate(runs=Sum("runs"), cost=Sum("cost_usd"))
    run_lat = run_latency(scope)
    return {
        "charts": [
            spend_chart(scope),
            orchestration_chart(scope),
            latency_chart(scope, run_lat),
            guardrail_chart(scope),
            plans,
            reviews,
        ],
        "shape": shape,
        "reviews": review_summary,
        "strategies": strategy_table(user, scope, run_lat),
        "per_model": spend_per_model(scope),
        "totals": {"runs": int(totals["runs"] or 0), "cost": _f(totals["cost"])},
    }
