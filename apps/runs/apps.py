from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "apps.runs"
    label = "runs"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_out
        from django.db import connections
        from django.db.models.signals import post_migrate, post_save

        from apps.engine.threads import set_task_cleanup
        from apps.runs.approvals import install_approval_hooks
        from apps.runs.models import Run
        from apps.runs.policy_ports import install_policy_ports
        from apps.runs.search import ensure_search_index
        from apps.runs.sink import on_run_saved
        from apps.runs.ws_access import on_logged_out

        install_policy_ports()  # run history and workers for policies (below runs)
        install_approval_hooks()  # held plans: the sink pauses them, the sweep expires them
        # The engine keeps its provider-call threads: one must not keep a connection it opened,
        # as a thread that ended would not. The sink already closes after each batch it stores
        # from such a thread (a pooled slot is not held through a provider wait); this covers
        # any other database use there.
        set_task_cleanup(connections.close_all)

        # Held answers (issue 13): a review decision reaches the run's live viewers.
        post_save.connect(on_run_saved, sender=Run, dispatch_uid="runs.review_notice")
        # Issue 39: a logout closes the session's open run sockets at once.
        user_logged_out.connect(on_logged_out, dispatch_uid="runs.ws_session_ended")
        # Issue 42: SQLite drops a table's triggers when a migration rebuilds it; the run search
        # index (FTS5) is re-made after every migrate that did.
        post_migrate.connect(ensure_search_index, sender=self, dispatch_uid="runs.search_index")
        # Servers start the lease keeper and sweeper once Django is set up: conductor_web.background.
