"""factory_boy factories for workers; they go through ``apps.workers.services`` (audited, granted)."""

from __future__ import annotations

from typing import Any

import factory

from apps.workers.models import Pool, Provider, Worker
from apps.workers.services import pool_create, provider_create, worker_create


class _ServiceFactory(factory.Factory):
    class Meta:
        abstract = True

    @classmethod
    def _build(cls, model_class: type[Any], *args: Any, **kwargs: Any) -> Any:
        return cls._create(model_class, *args, **kwargs)


class ProviderFactory(_ServiceFactory):
    class Meta:
        model = Provider

    slug = factory.Sequence(lambda n: f"provider-{n}")
    name = factory.LazyAttribute(lambda p: p.slug.replace("-", " ").title())
    kind = "openai_compatible"
    team = None
    base_url = "http://127.0.0.1:9/v1"
    api_key_env = ""
    api_key = None

    @classmethod
    def _create(cls, model_class: type[Provider], *args: Any, **kwargs: Any) -> Provider:
        return provider_create(actor=None, **kwargs)


class WorkerFactory(_ServiceFactory):
    class Meta:
        model = Worker

    provider = factory.SubFactory(ProviderFactory)
    slug = factory.Sequence(lambda n: f"worker-{n}")
    display_name = factory.LazyAttribute(lambda w: w.slug.replace("-", " ").title())
    model_name = "fake-model"
    strengths = "general reasoning"
    tags: list[str] = []

    @classmethod
    def _create(cls, model_class: type[Worker], *args: Any, **kwargs: Any) -> Worker:
        return worker_create(actor=None, **kwargs)


class PoolFactory(_ServiceFactory):
    class Meta:
        model = Pool

    team = None
    slug = factory.Sequence(lambda n: f"pool-{n}")
    name = factory.LazyAttribute(lambda p: p.slug.replace("-", " ").title())
    workers: list[Worker] = []

    @classmethod
    def _create(cls, model_class: type[Pool], *args: Any, **kwargs: Any) -> Pool:
        return pool_create(actor=None, **kwargs)


def build_openai_compatible_pool(
    *,
    team: Any,
    base_url: str,
    api_key: str,
    slug: str,
    provider_slug: str | None = None,
    workers: list[dict[str, Any]],
    conductor: dict[str, Any],
    pool_name: str = "Fake pool",
    provider_name: str = "Fake OpenAI",
    description: str = "",
    default_index: int = 0,
    timeout_s: int = 30,
) -> tuple[Pool, Provider, list[Worker], Worker]:
    """A pool on an ``openai_compatible`` provider at ``base_url`` (the loopback fake OpenAI
    server in tests and benchmarks), made the team's default pool. ``workers`` and ``conductor``
    are ``worker_create`` keyword arguments (slug, display_name, model_name, ...)."""
    from apps.governance.services import team_set_default_pool

    provider = provider_create(
        actor=None,
        team=team,
        slug=provider_slug or slug,
        name=provider_name,
        kind="openai_compatible",
        base_url=base_url,
        api_key=api_key,
    )
    rows = [worker_create(actor=None, provider=provider, timeout_s=timeout_s, **spec) for spec in workers]
    conductor_row = worker_create(actor=None, provider=provider, timeout_s=timeout_s, **conductor)
    pool = pool_create(
        actor=None,
        team=team,
        slug=slug,
        name=pool_name,
        description=description,
        workers=rows,
        default_worker=rows[default_index],
        conductor_worker=conductor_row,
    )
    team_set_default_pool(actor=None, team=team, pool=pool)
    return pool, provider, rows, conductor_row
