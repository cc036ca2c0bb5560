"""daphne's websocket close frames with the application's reason.

The ASGI ``websocket.close`` message carries a ``reason``; daphne 4.2 drops it (``serverClose``
sends the code only), so a socket closed because its session ended or its viewer lost access would
reach the browser with a bare number. Autobahn's ``sendClose`` takes the reason (UTF-8, cut to the
123 bytes a close frame holds); daphne's factory looks its protocol class up on itself, so a
subclass that passes the reason on is installed there (as ``apps.core.daphne_requests`` does
for HTTP).
"""

from __future__ import annotations

from typing import Any

from daphne import ws_protocol


def _closable(code: Any) -> bool:
    # What autobahn accepts (1000, or the registered and private ranges); other codes go the old way.
    return code is None or code == 1000 or (isinstance(code, int) and 3000 <= code <= 4999)


class ReasonedWebSocketProtocol(ws_protocol.WebSocketProtocol):
    def handle_reply(self, message: dict[str, Any]) -> None:
        reason = message.get("reason")
        code = message.get("code")
        if (
            message.get("type") == "websocket.close"
            and self.state != self.STATE_CONNECTING
            and isinstance(reason, str)
            and reason
            and _closable(code)
        ):
            self.sendClose(code=1000 if code is None else code, reason=reason)
            return
        super().handle_reply(message)


def install() -> None:
    ws_protocol.WebSocketFactory.protocol = ReasonedWebSocketProtocol
