"""Websocket authentication that does not queue behind every HTTP view (issue 14).

Channels' `AuthMiddlewareStack` loads the session and the user with `database_sync_to_async`,
i.e. on daphne's single thread-sensitive worker thread that every sync HTTP view shares: a burst
of a thousand websocket handshakes then waits there one by one, past daphne's connect timeout.
This stack does the same lookup (Channels' own `get_user`, so the session hash check and the
backend rules are unchanged) on the executor threads, in parallel (conductor_web.executor_db).
"""

from __future__ import annotations

from typing import Any

from channels.auth import AuthMiddleware, get_user
from channels.sessions import CookieMiddleware, SessionMiddleware

from conductor_web.executor_db import in_executor


class ParallelAuthMiddleware(AuthMiddleware):
    async def resolve_scope(self, scope: dict[str, Any]) -> None:
        # get_user.func: the plain function under Channels' async wrapper.
        scope["user"]._wrapped = await in_executor(get_user.func, scope)


def ParallelAuthMiddlewareStack(inner: Any) -> Any:  # named like Channels' AuthMiddlewareStack
    return CookieMiddleware(SessionMiddleware(ParallelAuthMiddleware(inner)))
