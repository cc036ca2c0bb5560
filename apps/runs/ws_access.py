"""An open run socket follows its session and its viewer's access (issue 39).

The handshake checks the viewer once (``apps.runs.consumers``); what decided that answer can change
while the socket streams: the viewer logs out, the session expires, a password change or a
deactivation invalidates it, the viewer is removed from the team or changes role, a grant is
revoked. The socket then closes with a code and a reason the browser can show:

==========================  ======  =================================================================
``CLOSE_SESSION_ENDED``     4401    the session ended (logout, expiry, invalidated): sign in again
``CLOSE_ACCESS_LOST``       4403    the viewer may no longer view the run (same code as a refused
                                    handshake)
``CLOSE_WITHHELD``          4409    the run's content is now withheld from this viewer (a held
                                    answer, the review permission gone): reconnect for the withheld
                                    view
==========================  ======  =================================================================

How it stays cheap per event batch: the sink publishes each batch with the access version it read
in the batch's own statement (``apps.governance.access_version``: one stamp every change to a
membership, a grant, a user or a policy moves, in the change's transaction). A viewer compares it
with the stamp read when its access was last decided; only when it moved (or is unknown, or
``WEBSOCKET_ACCESS_RECHECK_S`` passed) does it re-check, in one executor job (:func:`recheck`):
the session as the store has it now, the user it names, ``Run.objects.allows(user, "view")`` and
what that viewer may see (``selectors.viewer_access``, the held-answer rule). Messages published
without a stamp (a cancel, a plan decision, a review) are re-checked each time; they are rare.

A logout reaches the session's open sockets at once, not at their next batch: ``user_logged_out``
sends ``session.ended`` to a channel-layer group named after the session (a keyed hash of the
session key: the key itself is a credential), which every socket of that session joined before its
handshake read anything. The session's expiry, or its deletion by other means, is found by the
periodic re-check.

A re-check costs a few queries (the session, the user, the visibility rule, the held-answer rule),
and one access-version change makes every open socket re-check on its next batch. Sockets of one
process that re-check for the same change, session and run (tabs of one browser, viewers sharing
a login) share one job (:class:`SharedChecks`). Cost: ``bench/RUNS.md``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import import_module
from typing import Any
from uuid import UUID

from channels.auth import get_user
from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils.crypto import salted_hmac

from apps.core.types import Viewer
from apps.governance.access_version import stamp_expression
from apps.runs import selectors
from apps.runs.models import Run
from apps.runs.sink import send_to_group

CLOSE_SESSION_ENDED = 4401
CLOSE_ACCESS_LOST = 4403
CLOSE_WITHHELD = 4409

# Close reasons fit a close frame (123 bytes) and name the rule, never the run's content.
REASON_SESSION_ENDED = "session ended: sign in again to follow this run"
REASON_ACCESS_LOST = "access lost: you may no longer view this run (team membership or view_team_runs)"
REASON_WITHHELD = "content withheld: the answer is held for review (review_team_runs); reconnect"

SESSION_ENDED = "session.ended"  # the layer message a logout sends to its session's sockets
SESSION_GROUP_PREFIX = "wssession."


def recheck_interval_s() -> float:
    return float(getattr(settings, "WEBSOCKET_ACCESS_RECHECK_S", 60.0))


def session_key(scope: dict[str, Any]) -> str | None:
    """The session key the handshake's cookie names (no database read)."""
    session = scope.get("session")
    if session is None:
        return None
    try:
        key = session.session_key
    except AttributeError:
        return None
    return key if isinstance(key, str) and key else None


def session_group(key: str) -> str:
    digest = salted_hmac("apps.runs.ws_access.session", key, algorithm="sha256").hexdigest()
    return SESSION_GROUP_PREFIX + digest[:48]


def on_logged_out(sender: Any, request: Any = None, user: Viewer = None, **kwargs: Any) -> None:
    """``user_logged_out`` (sent before the session is flushed): close this session's sockets."""
    key = getattr(getattr(request, "session", None), "session_key", None)
    if isinstance(key, str) and key:
        group = session_group(key)
        send_to_group(group, {"type": SESSION_ENDED}, SESSION_ENDED)


def read_run(
    run_id: UUID | str, *, related: tuple[str, ...] = ("team", "pool", "created_by")
) -> tuple[Run, int | None]:
    """The run row (with ``related``: the snapshot shows all three) and the access version, in one
    statement. The stamp is read before any permission is decided on it: a change committed
    meanwhile moves the stamp past this one, so the next batch re-checks."""
    run = Run.objects.select_related(*related).annotate(_access_stamp=stamp_expression()).get(pk=run_id)
    return run, run._access_stamp  # type: ignore[attr-defined]


def current_user(scope: dict[str, Any], user: Viewer) -> Any | None:
    """``user`` as its session names it now, freshly read; None when that session ended (logged
    out, expired, deleted, its auth hash no longer matching after a password change) or the user
    can no longer sign in (deactivated). Without a session (a test scope), the user row decides."""
    if "session" in scope:
        key = session_key(scope)
        if key is None:
            return None
        store = import_module(settings.SESSION_ENGINE).SessionStore(key)
        # Channels' get_user (as at the handshake): the backend's rules and the session hash check.
        fresh = get_user.func({"session": store})
    else:
        pk = getattr(user, "pk", None)
        fresh = get_user_model()._default_manager.filter(pk=pk).first() if pk is not None else None
        if fresh is not None and not fresh.is_active:
            fresh = None
    if fresh is None or not fresh.is_authenticated or fresh.pk != getattr(user, "pk", None):
        return None
    return fresh


@dataclass(frozen=True, slots=True)
class Verdict:
    close: tuple[int, str] | None = None  # code and reason when the socket must close
    stamp: int | None = None
    user: Viewer = None
    access: selectors.ViewerAccess | None = None


class SharedChecks:
    """Per event loop (a daphne process has one): the re-checks caused by one access-version
    change, keyed by (stamp, session, user, run), run once and awaited by every socket asking the
    same. Only the newest stamp's entries are kept: a newer change means every answer must be
    asked again."""

    def __init__(self) -> None:
        self._stamp: int | None = None
        self._pending: dict[tuple[Any, ...], asyncio.Future[Verdict]] = {}

    async def get(self, stamp: int, key: tuple[Any, ...], check: Callable[[], Awaitable[Verdict]]) -> Verdict:
        if stamp != self._stamp:
            self._stamp, self._pending = stamp, {}
        shared = self._pending.get(key)
        if shared is None:
            shared = self._pending[key] = asyncio.ensure_future(check())
        try:
            return await asyncio.shield(shared)
        except BaseException:
            if self._pending.get(key) is shared and shared.done():
                del self._pending[key]  # a failed check is not an answer: the next asks again
            raise


def recheck(scope: dict[str, Any], run_id: UUID | str, user: Viewer) -> Verdict:
    """Sync (an executor job): may the socket's viewer still follow the run, and see what?"""
    try:
        run, stamp = read_run(run_id, related=("team",))  # what the two rules below read
    except Run.DoesNotExist:
        return Verdict(close=(CLOSE_ACCESS_LOST, REASON_ACCESS_LOST))
    fresh = current_user(scope, user)
    if fresh is None:
        return Verdict(close=(CLOSE_SESSION_ENDED, REASON_SESSION_ENDED))
    if not Run.objects.allows(fresh, "view", run):
        return Verdict(close=(CLOSE_ACCESS_LOST, REASON_ACCESS_LOST))
    return Verdict(stamp=stamp, user=fresh, access=selectors.viewer_access(user=fresh, run=run))
