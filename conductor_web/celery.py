"""Celery app. Tasks take ids only and use the JSON serializer (see settings.base)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "conductor_web.settings.local")

app = Celery("conductor_web")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
