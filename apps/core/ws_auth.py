"""Websocket authentication inside the consumer's one database hop (issues 14 and 15).

Channels' `AuthMiddlewareStack` loads the session and the user with `database_sync_to_async`,
i.e. on daphne's single thread-sensitive worker thread that every sync HTTP view shares, and as a
job of its own ahead of the consumer's reads. In a burst of a thousand handshakes every such job
is queued before the first consumer read, so all handshakes finish together at the end, past
daphne's 5 s connect timeout. Here the middleware only puts Channels' lazy user into the scope and
the consumer resolves it (`resolve_user`, Channels' own `get_user`, so the session hash check and
the backend rules are unchanged) in the same executor job as its permission check and snapshot:
one job per handshake, finished in arrival order (apps.core.executor_db).

A consumer behind this stack must call `resolve_user` (from sync code, off the event loop) before
it looks at `scope["user"]`; reading it earlier raises Channels' "Accessing scope user before it
is ready", never a silent anonymous user.
"""

from __future__ import annotations

from typing import Any

from channels.auth import AuthMiddleware, UserLazyObject, get_user
from channels.sessions import CookieMiddleware, SessionMiddleware
from django.utils.functional import empty


class DeferredAuthMiddleware(AuthMiddleware):
    async def resolve_scope(self, scope: dict[str, Any]) -> None:
        """Left to the consumer's database hop (`resolve_user`)."""


def resolve_user(scope: dict[str, Any]) -> Any:
    """The scope's user, loaded from the session on first use. Sync: call it on an executor thread."""
    user = scope.get("user")
    if isinstance(user, UserLazyObject) and user._wrapped is empty:
        # get_user.func: the plain function under Channels' async wrapper.
        user._wrapped = get_user.func(scope)
    return user


def ParallelAuthMiddlewareStack(inner: Any) -> Any:  # named like Channels' AuthMiddlewareStack
    return CookieMiddleware(SessionMiddleware(DeferredAuthMiddleware(inner)))
