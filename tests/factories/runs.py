"""factory_boy factories for runs (rows only: nothing is executed)."""

from __future__ import annotations

from datetime import timedelta

import factory
from django.utils import timezone

from apps.runs.models import Run, RunEvent, RunStatus, Step


class RunFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Run

    question = factory.Sequence(lambda n: f"Question number {n}?")
    status = RunStatus.QUEUED
    strategy = "conductor"
    preset = "mini"
    deadline_at = factory.LazyFunction(lambda: timezone.now() + timedelta(minutes=10))


class StepFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Step

    index = factory.Sequence(lambda n: n)
    worker_key = "fake-solver"
    instruction = "Solve it."
    access = factory.LazyFunction(list)
    messages = factory.LazyFunction(lambda: [{"role": "user", "content": "Q"}])
    status = "succeeded"


class RunEventFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = RunEvent

    type = "step.delta"
    data = factory.LazyFunction(dict)
