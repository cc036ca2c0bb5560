"""A TCP proxy on loopback that a test controls, to simulate an outage of a real service
(broker, database, Redis) without stopping the shared service itself.

    proxy = TcpProxy(0, "127.0.0.1", 5672)   # 0: pick a free port (see .listen_port)
    url = f"amqp://guest:guest@127.0.0.1:{proxy.listen_port}//"
    proxy.stop_accepting(); proxy.cut_all()  # outage: new connections refused, open ones reset
    proxy.resume()                           # service back on the same port
    proxy.close()

Only loopback addresses are accepted as listen or target hosts.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
from typing import Any

_LOOPBACK_NAMES = {"localhost"}


def _check_loopback(host: str) -> None:
    if host in _LOOPBACK_NAMES:
        return
    if not ipaddress.ip_address(host).is_loopback:
        raise ValueError(f"TcpProxy only proxies loopback addresses, not {host!r}")


class TcpProxy:
    def __init__(
        self, listen_port: int, target_host: str, target_port: int, *, listen_host: str = "127.0.0.1"
    ) -> None:
        _check_loopback(listen_host)
        _check_loopback(target_host)
        self.listen_host = listen_host
        self.listen_port = listen_port
        self.target = (target_host, target_port)
        self._lock = threading.Lock()
        self._pairs: set[tuple[socket.socket, socket.socket]] = set()
        self._listener: socket.socket | None = None
        self._accepting = threading.Event()
        self.accepted = 0  # connections accepted so far, to see that a client really came back
        self.resume()

    @property
    def url_host(self) -> str:
        return f"{self.listen_host}:{self.listen_port}"

    # -- control ----------------------------------------------------------------------------------

    def resume(self) -> None:
        """Listen (again) on the same port; new connections are forwarded to the target."""
        with self._lock:
            if self._listener is not None:
                return
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.listen_host, self.listen_port))
            sock.listen(64)
            self.listen_port = sock.getsockname()[1]
            self._listener = sock
        threading.Thread(target=self._accept_loop, args=(sock,), daemon=True, name="tcpproxy-accept").start()

    def stop_accepting(self) -> None:
        """Close the listening socket: new connections are refused (ECONNREFUSED)."""
        with self._lock:
            sock, self._listener = self._listener, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def cut_all(self) -> None:
        """Reset every open connection in both directions."""
        with self._lock:
            pairs, self._pairs = set(self._pairs), set()
        for a, b in pairs:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    # SO_LINGER 0: the peer gets a RST, like a crashed host, not a polite FIN.
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                with contextlib.suppress(OSError):
                    # close() alone does not end a recv() blocked in a pump thread: that call keeps
                    # the socket open, and a client waiting for a reply on it (a BZPOPMIN) waited
                    # forever, never seeing the outage. shutdown() wakes it.
                    s.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    s.close()

    def close(self) -> None:
        self.stop_accepting()
        self.cut_all()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- plumbing ---------------------------------------------------------------------------------

    def _accept_loop(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # listener closed by stop_accepting
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            pair = (client, upstream)
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    upstream.close()
                    return
                self._pairs.add(pair)
                self.accepted += 1
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(
                    target=self._pump, args=(src, dst, pair), daemon=True, name="tcpproxy-pump"
                ).start()

    def _pump(
        self, src: socket.socket, dst: socket.socket, pair: tuple[socket.socket, socket.socket]
    ) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._pairs.discard(pair)
            for s in pair:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    s.close()
