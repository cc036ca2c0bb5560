"""The HTTP client every SDK worker uses: egress-checked at the socket, redirects never followed.

``EgressBackend.connect_tcp`` resolves the host once, checks every address with
``apps.engine.egress.resolve_checked`` and connects to exactly those addresses, so a DNS answer
cannot change between the check and the connection. TLS still verifies the certificate against
the host name (httpcore passes the URL's host as SNI / server_hostname after ``connect_tcp``).

``EgressClient.send`` refuses a request sent outside an admitted request's ``on_wire()`` (the
outbound gate, issue 39) and forces ``follow_redirects=False`` whatever the SDK asks per request: a
3xx reaches the SDK as a status error (mapped to ``ProviderRedirect``) and the Authorization
header goes nowhere else. ``trust_env=False`` keeps HTTP(S)_PROXY from routing around the check.

Every socket read and write of a call registers a canceller on the call's scope
(``apps.engine.calls``, issue 44): when the executor abandons the call, the socket is shut down, the
blocked SDK call returns at once and the provider sees the client leave (the connection is not
reused).

Imported lazily (only when an SDK worker is built) so importing the engine stays cheap.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterable
from typing import Any

import httpcore2
import httpx2

from apps.engine import calls
from apps.engine.egress import EgressDenied, EgressPolicy, resolve_checked
from apps.engine.providers.gate import OutboundNotAdmitted, admitted_on_wire

# The SDKs' own defaults for their shared clients (many concurrent steps, keep-alive).
LIMITS = httpx2.Limits(max_connections=1000, max_keepalive_connections=100, keepalive_expiry=5.0)
KEEPALIVE_OPTIONS: list[tuple[int, int, int]] = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]


class EgressConnectError(httpcore2.ConnectError):
    """Raised instead of connecting; ``__cause__`` is the ``EgressDenied`` naming the rule."""


class EgressBackend(httpcore2.SyncBackend):
    def __init__(self, policy: EgressPolicy) -> None:
        self.policy = policy

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.NetworkStream:
        try:
            infos = resolve_checked(host, port, self.policy)
        except EgressDenied as denied:
            raise EgressConnectError(str(denied)) from denied
        except (OSError, UnicodeError) as err:
            raise httpcore2.ConnectError(f"Could not resolve {host}.") from err
        last_error: Exception | None = None
        for _family, _type, _proto, _name, sockaddr in infos:
            # A numeric address: the parent's create_connection does no second lookup.
            try:
                return _CancellableStream(
                    super().connect_tcp(str(sockaddr[0]), port, timeout, local_address, socket_options)
                )
            except (httpcore2.ConnectError, httpcore2.ConnectTimeout) as err:
                last_error = err
        raise last_error or httpcore2.ConnectError(f"No address for {host}.")


class _CancellableStream(httpcore2.NetworkStream):
    """A connection whose blocking reads and writes end when the current call is cancelled."""

    def __init__(self, inner: httpcore2.NetworkStream) -> None:
        self._inner = inner

    def _abort(self) -> None:
        sock = self._inner.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes a recv blocked in another thread

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        with calls.on_cancel(self._abort):
            return self._inner.read(max_bytes, timeout)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        with calls.on_cancel(self._abort):
            self._inner.write(buffer, timeout)

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore2.NetworkStream:
        return _CancellableStream(self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class EgressTransport(httpx2.HTTPTransport):
    def __init__(self, policy: EgressPolicy) -> None:
        self._pool = httpcore2.ConnectionPool(
            ssl_context=httpx2.create_ssl_context(verify=True, trust_env=True),
            max_connections=LIMITS.max_connections,
            max_keepalive_connections=LIMITS.max_keepalive_connections,
            keepalive_expiry=LIMITS.keepalive_expiry,
            network_backend=EgressBackend(policy),
            socket_options=KEEPALIVE_OPTIONS,
        )


class EgressClient(httpx2.Client):
    def send(self, request: httpx2.Request, *, stream: bool = False, **kwargs: Any) -> httpx2.Response:
        if admitted_on_wire() is None:
            # Only a request the outbound gate admitted leaves (apps.engine.providers.gate): an SDK
            # client reached any other way opens no socket.
            # A transport error the SDKs know (a connection that was never made), caused by the
            # refusal: ``connection_error`` names it like an egress denial.
            raise httpx2.ConnectError(
                "not sent: the request did not pass the outbound gate", request=request
            ) from (
                OutboundNotAdmitted(
                    "the request did not pass the outbound gate (apps.engine.providers.gate), so it was not sent"
                )
            )
        kwargs["follow_redirects"] = False
        return super().send(request, stream=stream, **kwargs)


def build_client(policy: EgressPolicy) -> EgressClient:
    return EgressClient(
        transport=EgressTransport(policy),
        follow_redirects=False,
        trust_env=False,
        timeout=httpx2.Timeout(600.0, connect=5.0),
    )


def egress_denial(exc: BaseException | None) -> EgressDenied | None:
    """The ``EgressDenied`` somewhere in an SDK exception's cause chain, if any."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, EgressDenied):
            return exc
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None
