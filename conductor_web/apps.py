import os

from django.apps import AppConfig
from django.conf import settings

from apps.core.executor_db import forget_parent_connections


class ConductorWebConfig(AppConfig):
    name = "conductor_web"
    verbose_name = "Conductor Web"

    def ready(self) -> None:
        from conductor_web import auth  # registers the login-failure audit receiver

        auth.connect_signals()
        # Once per process: a forked child never touches its parent's pooled connections.
        os.register_at_fork(after_in_child=forget_parent_connections)
        if getattr(settings, "CONTENTTYPE_CACHE_DISABLED", False):
            _disable_contenttype_cache()


def _disable_contenttype_cache() -> None:
    """Test servers only: transactional tests flush the database and recreate content types with
    new ids, while a long-lived daphne/Celery process would keep the old ids cached and guardian
    would then deny every object permission. Never enabled outside the test settings."""
    from django.contrib.contenttypes.models import ContentTypeManager
    from guardian import shortcuts

    # Deliberate monkeypatches of private, unstubbed attributes (test servers only).
    ContentTypeManager._add_to_cache = lambda self, using, ct: None  # type: ignore[attr-defined]
    # guardian memoises content types per permission codename in an lru_cache of its own.
    uncached = shortcuts._get_ct_cached.__wrapped__  # type: ignore[attr-defined]
    uncached.cache_clear = lambda: None  # type: ignore[attr-defined]  # guardian clears it on post_migrate
    shortcuts._get_ct_cached = uncached  # type: ignore[assignment]  # no longer an lru_cache, on purpose
