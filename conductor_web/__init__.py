"""Conductor Web project package (settings, URLs, ASGI, Celery app)."""

from .celery import app as celery_app

__all__ = ["celery_app"]
