"""daphne's HTTP requests without Twisted's own form parsing.

Twisted's ``Request`` parses every POST body with a form content type itself (``request.args``),
and for that parses the Content-Type header of every POST through ``email.message`` (about 2% of
a served ``/v1`` request's CPU, JSON included). daphne never reads ``request.args``: it hands the
raw body to the ASGI application, where Django parses forms. Worse, a multipart body Twisted could
not parse was answered by Twisted with a bare 400 and a dropped connection, so ``/v1`` clients got
no OpenAI-shaped error and Django never saw the request. Twisted has a switch for this
(``parsePOSTFormSubmission``); daphne does not expose it, so its request class is replaced by a
subclass that turns it off.
"""

from __future__ import annotations

from typing import Any

from daphne import http_protocol


class BodyOnlyWebRequest(http_protocol.WebRequest):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._parsePOSTFormSubmission = False


def install() -> None:
    """daphne's factory looks ``WebRequest`` up in its module for each connection it builds."""
    http_protocol.WebRequest = BodyOnlyWebRequest  # type: ignore[misc]
