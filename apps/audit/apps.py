from typing import Any

from django.apps import AppConfig
from django.conf import settings

# 0 while ``manage.py flush`` runs in this process (see apps.audit.management.commands.flush):
# the SQLite append-only trigger consults it through the SQL function audit_guard_active().
GUARD = {"active": 1}


def _register_sqlite_guard(sender: Any, connection: Any, **kwargs: Any) -> None:
    if connection.vendor == "sqlite":
        connection.connection.create_function(
            "audit_guard_active", 0, lambda: GUARD["active"], deterministic=False
        )


def _start_in_worker(**kwargs: Any) -> None:
    # Imported here: apps.py loads before the app registry is ready (the sequencer uses models).
    from apps.audit.sequencer import start_sequencer_thread

    start_sequencer_thread(publish=False)  # beat publishes tree heads in the distributed mode


class AuditConfig(AppConfig):
    name = "apps.audit"
    label = "audit"

    def ready(self) -> None:
        from django.db.backends.signals import connection_created

        from apps.audit.checkpoints import checkpoint_publish
        from apps.audit.sequencer import set_publisher

        set_publisher(checkpoint_publish)

        connection_created.connect(_register_sqlite_guard, dispatch_uid="audit-sqlite-guard")
        if settings.EXECUTION_BACKEND == "celery":
            from celery.signals import worker_process_init, worker_ready

            # Every worker process (and every server: conductor_web.background) runs a
            # sequencer; the advisory lock lets exactly one pass run at a time.
            worker_ready.connect(_start_in_worker, weak=False, dispatch_uid="audit-seq-ready")
            worker_process_init.connect(_start_in_worker, weak=False, dispatch_uid="audit-seq-init")
