"""The access version: one stamp the database changes whenever anything that decides access does.

A ``/v1`` request asks the same questions every time — may this key's principal use this pool, run
on this team, which workers does the pool hold, which policy is in force — and the answers change
only when an administrator changes a grant, a membership, a pool, a worker, a provider or a
policy. (A team's evaluators, which every finished run reads and which change as rarely, ride
on the same stamp.) Database triggers on those tables (installed by each owning app's migration through
:func:`install`) set one row's ``stamp`` to a fresh random number in the same transaction as the
change, so:

* a reader that sees the new stamp also sees the change (both become visible at its commit);
* a stamp never repeats (random, not a counter): a rolled-back transaction or a flushed test
  database cannot make an old answer look current again;
* bulk ``UPDATE``s, raw SQL and the Django admin are covered, not just ``save()`` signals.

Readers read the stamp inside a query they make anyway (:func:`stamp_expression`, e.g. with the
API key), then look answers up in an :class:`AccessCache` keyed by it: a change anywhere in the
tracked tables misses every cached answer at once, in every process. The key itself (revocation,
expiry, its principal) is still read on every request. No stamp (the row missing): no caching.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterable
from typing import Any, Generic, TypeVar

from django.db import migrations
from django.db.models import Subquery

from apps.governance.models import AccessVersion

V = TypeVar("V")

TABLE = "governance_accessversion"

# Frozen in migrations by name; listed here for the reader (each owning app installs its own).
TRACKED_TABLES = (
    "auth_user",
    "auth_group",
    "auth_user_groups",
    "auth_permission",
    "guardian_userobjectpermission",
    "guardian_groupobjectpermission",
    "governance_team",
    "governance_membership",
    "workers_provider",
    "workers_worker",
    "workers_pool",
    "workers_poolworker",
    "api_apikey_allowed_pools",
    "policies_policy",
    "policies_policyversion",
    # Not access, but read by every finished run and changed as rarely: a team's evaluators.
    "feedback_evaluator",
    "feedback_metric",
)


def stamp_expression() -> Subquery:
    """The current stamp as an annotation (``None`` when the row is missing)."""
    return Subquery(AccessVersion.objects.filter(pk=1).values("stamp")[:1])


def read_stamp() -> int | None:
    """The current stamp, in a query of its own (prefer :func:`stamp_expression`)."""
    return AccessVersion.objects.filter(pk=1).values_list("stamp", flat=True).first()


class AccessCache(Generic[V]):
    """Answers keyed by (stamp, question). Entries of an older stamp are dropped as soon as a newer
    stamp is stored (no answer outlives the change that made it stale); ``size`` bounds the rest."""

    def __init__(self, size: int = 1024) -> None:
        self.size = size
        self._entries: OrderedDict[tuple[int, Hashable], V] = OrderedDict()
        self._stamp: int | None = None
        self._lock = threading.Lock()

    def get(self, stamp: int | None, question: Hashable) -> V | None:
        if stamp is None:
            return None
        with self._lock:
            return self._entries.get((stamp, question))

    def put(self, stamp: int | None, question: Hashable, answer: V) -> None:
        if stamp is None:
            return
        with self._lock:
            if stamp != self._stamp:
                # Stamps are random, so "newer" is simply "the one seen last": keep one generation.
                self._entries.clear()
                self._stamp = stamp
            self._entries[(stamp, question)] = answer
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._stamp = None


# --- triggers (called from migrations) ------------------------------------------------------------

# Table names below are this module's constants or migration constants, never input.
_PG_FUNCTION = f"""
CREATE OR REPLACE FUNCTION governance_access_changed() RETURNS trigger AS $$
BEGIN
    INSERT INTO {TABLE} (id, stamp) VALUES (1, (random() * 4.0e18)::bigint)
    ON CONFLICT (id) DO UPDATE SET stamp = EXCLUDED.stamp;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
"""  # noqa: S608

_SQLITE_BODY = (
    f"INSERT INTO {TABLE} (id, stamp) VALUES (1, random()) "  # noqa: S608
    "ON CONFLICT (id) DO UPDATE SET stamp = excluded.stamp;"
)


def _name(table: str, op: str = "") -> str:
    return f"access_version_{table}{'_' + op if op else ''}"


def install(schema_editor: Any, tables: Iterable[str]) -> None:
    """Triggers on ``tables`` that change the stamp on every insert, update or delete."""
    vendor = schema_editor.connection.vendor
    for table in tables:
        if vendor == "postgresql":
            schema_editor.execute(_PG_FUNCTION)
            schema_editor.execute(f'DROP TRIGGER IF EXISTS {_name(table)} ON "{table}"')
            schema_editor.execute(
                f'CREATE TRIGGER {_name(table)} AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON "{table}" '
                "FOR EACH STATEMENT EXECUTE FUNCTION governance_access_changed()"
            )
        elif vendor == "sqlite":
            for op in ("INSERT", "UPDATE", "DELETE"):
                name = _name(table, op.lower())
                schema_editor.execute(f"DROP TRIGGER IF EXISTS {name}")
                schema_editor.execute(
                    f'CREATE TRIGGER {name} AFTER {op} ON "{table}" BEGIN {_SQLITE_BODY} END'
                )
        else:  # another backend: no triggers, so no stamp changes — caching must stay off
            schema_editor.execute(f"DELETE FROM {TABLE}")  # noqa: S608


def tracking(tables: Iterable[str]) -> Any:
    """The migration operation that installs (and on reverse removes) the triggers on ``tables``."""
    frozen = tuple(tables)
    return migrations.RunPython(
        lambda apps, schema_editor: install(schema_editor, frozen),
        lambda apps, schema_editor: uninstall(schema_editor, frozen),
    )


def uninstall(schema_editor: Any, tables: Iterable[str]) -> None:
    vendor = schema_editor.connection.vendor
    for table in tables:
        if vendor == "postgresql":
            schema_editor.execute(f'DROP TRIGGER IF EXISTS {_name(table)} ON "{table}"')
        elif vendor == "sqlite":
            for op in ("insert", "update", "delete"):
                schema_editor.execute(f"DROP TRIGGER IF EXISTS {_name(table, op)}")


def install_update_of(schema_editor: Any, table: str, columns: Iterable[str]) -> None:
    """Narrow ``table``'s update trigger to ``columns``: an UPDATE that sets none of them (a login
    writing ``auth_user.last_login``) decides no access, so it must not empty every cache and make
    every open websocket re-check. Inserts, deletes and truncates still change the stamp."""
    cols = ", ".join(f'"{c}"' for c in columns)
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(_PG_FUNCTION)
        schema_editor.execute(f'DROP TRIGGER IF EXISTS {_name(table)} ON "{table}"')
        schema_editor.execute(f'DROP TRIGGER IF EXISTS {_name(table, "update")} ON "{table}"')
        schema_editor.execute(
            f'CREATE TRIGGER {_name(table)} AFTER INSERT OR DELETE OR TRUNCATE ON "{table}" '
            "FOR EACH STATEMENT EXECUTE FUNCTION governance_access_changed()"
        )
        schema_editor.execute(
            f'CREATE TRIGGER {_name(table, "update")} AFTER UPDATE OF {cols} ON "{table}" '
            "FOR EACH STATEMENT EXECUTE FUNCTION governance_access_changed()"
        )
    elif vendor == "sqlite":
        name = _name(table, "update")
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {name}")
        schema_editor.execute(
            f'CREATE TRIGGER {name} AFTER UPDATE OF {cols} ON "{table}" BEGIN {_SQLITE_BODY} END'
        )


def uninstall_update_of(schema_editor: Any, table: str) -> None:
    """Back to one trigger for every write (what :func:`install` made)."""
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f'DROP TRIGGER IF EXISTS {_name(table, "update")} ON "{table}"')
    install(schema_editor, (table,))
