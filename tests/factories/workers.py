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
