"""``python -m conductor_web.serve``: ``WEB_PROCESSES`` server processes on one address.

The server is ``WEB_SERVER``: daphne (the default) or uvicorn (on uvloop and httptools, with the
``websockets`` library for the run pages' sockets). Arguments after ``--`` go to that server.

A daphne process runs Python on one core at a time (the GIL), so the throughput of served
``/v1`` runs flattens at what one core can do, whatever the number of clients (bench/API.md).
This starts ``WEB_PROCESSES`` daphne processes, each listening on its own socket bound to the
same address with ``SO_REUSEPORT``. The kernel spreads new connections over the sockets. With
one shared socket instead, the first process to wake (Twisted accepts up to a hundred
connections at a time) would take a whole burst of clients.

It also supervises them:

- A child that dies is replaced, with a fresh socket. The connections waiting in the dead child's
  backlog are reset and their clients retry. The runs it had accepted are re-queued by the lease
  rules, as for any dead executor.
- A slot that keeps dying (``MAX_RESTARTS`` within ``RESTART_WINDOW_S``) stops everything with
  exit status 1: a crash loop must be seen, not hidden.
- SIGTERM or SIGINT stops every child: SIGTERM first, SIGKILL after ``STOP_TIMEOUT_S``.

The processes share only the database, the channel layer and the broker, so the settings refuse
``WEB_PROCESSES`` > 1 on the embedded backends. SQLite's writers are queued per process, and a
viewer on the in-memory channel layer sees only its own process's runs.

    WEB_PROCESSES=2 python -m conductor_web.serve --host 127.0.0.1 --port 8000 [-- daphne args]

Each child is started through ``--adopt``, which hands it its socket the way systemd's socket
activation does (fd 3, ``LISTEN_FDS``, ``LISTEN_PID``, ``LISTEN_FDNAMES``), then execs daphne with the
``systemd:domain=INET|INET6:index=0`` endpoint. This works for IPv4 and IPv6 alike (daphne's
``--fd`` assumes IPv4).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

APP = "conductor_web.asgi:application"
MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0
STOP_TIMEOUT_S = 10.0


def listen(host: str, port: int, backlog: int) -> socket.socket:
    """A listening socket on ``host:port`` that other sockets may share (``SO_REUSEPORT``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host.strip("[]"), port))
    sock.listen(backlog)
    return sock


@dataclass
class Slot:
    index: int
    sock: socket.socket
    proc: subprocess.Popen[bytes]
    starts: list[float] = field(default_factory=list)


class Supervisor:
    def __init__(self, host: str, port: int, processes: int, backlog: int, daphne_args: list[str]) -> None:
        self.host, self.backlog, self.daphne_args = host, backlog, daphne_args
        self.server = configured_server()
        first = listen(host, port, backlog)
        self.port = int(first.getsockname()[1])  # port 0: the others join the port it got
        self.slots = [self._start(0, first)]
        self.slots += [self._start(i, listen(host, self.port, backlog)) for i in range(1, processes)]
        self.stopping = False

    def _start(self, index: int, sock: socket.socket, starts: list[float] | None = None) -> Slot:
        family = "INET6" if sock.family == socket.AF_INET6 else "INET"
        cmd = [sys.executable, "-m", "conductor_web.serve", "--adopt", str(sock.fileno()), "--family", family]
        # Our own interpreter and module; the daphne arguments are the operator's own command line.
        proc = subprocess.Popen([*cmd, "--", *self.daphne_args], pass_fds=(sock.fileno(),))  # noqa: S603
        return Slot(index, sock, proc, [*(starts or []), time.monotonic()])

    def check(self) -> None:
        """Replace every child that exited; raise SystemExit(1) on a crash loop."""
        for i, slot in enumerate(self.slots):
            code = slot.proc.poll()
            if code is None or self.stopping:
                continue
            slot.sock.close()  # its backlog goes with it; the replacement listens afresh
            recent = [t for t in slot.starts if time.monotonic() - t < RESTART_WINDOW_S]
            if len(recent) >= MAX_RESTARTS:
                log(
                    f"{self.server} slot {slot.index} exited {len(recent)} times in {RESTART_WINDOW_S:.0f} s; stopping"
                )
                self.stop()
                raise SystemExit(1)
            log(
                f"{self.server} process {slot.proc.pid} (slot {slot.index}) exited with {code}; starting another"
            )
            self.slots[i] = self._start(slot.index, listen(self.host, self.port, self.backlog), recent)

    def stop(self) -> None:
        self.stopping = True
        for slot in self.slots:
            if slot.proc.poll() is None:
                slot.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for slot in self.slots:
            try:
                slot.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                slot.proc.kill()
                slot.proc.wait()
            slot.sock.close()


def log(message: str) -> None:
    print(f"conductor_web.serve: {message}", file=sys.stderr, flush=True)


def adopt(fd: int, family: str, daphne_args: list[str]) -> None:
    """In a child: the socket becomes fd 3 with systemd's variables, then this process becomes
    daphne (same pid, as ``LISTEN_PID`` requires), or serves it with uvicorn."""
    if configured_server() == "uvicorn":
        serve_uvicorn(socket.socket(fileno=fd), daphne_args)
        return
    if fd != 3:
        os.dup2(fd, 3)
        os.close(fd)
    os.set_inheritable(3, True)
    os.environ["LISTEN_FDS"] = "1"
    os.environ["LISTEN_PID"] = str(os.getpid())
    os.environ["LISTEN_FDNAMES"] = "http"  # Twisted wants as many names as descriptors
    endpoint = f"systemd:domain={family}:index=0"
    os.execv(sys.executable, [sys.executable, "-m", "daphne", "-e", endpoint, *daphne_args, APP])  # noqa: S606


UVICORN_FLAGS = {"--no-access-log": ("access_log", False), "--proxy-headers": ("proxy_headers", True)}


def serve_uvicorn(sock: socket.socket, args: list[str]) -> None:
    """Serve the app with uvicorn on an inherited listening socket (its family read from the
    socket: uvicorn's own ``--fd`` assumes a Unix socket). ``args``: ``--no-access-log``,
    ``--proxy-headers``, ``--timeout-keep-alive N``."""
    import uvicorn

    options: dict[str, object] = {}
    rest = list(args)
    while rest:
        flag = rest.pop(0)
        if flag in UVICORN_FLAGS:
            name, value = UVICORN_FLAGS[flag]
            options[name] = value
        elif flag == "--timeout-keep-alive" and rest:
            options["timeout_keep_alive"] = int(rest.pop(0))
        else:
            log(f"uvicorn: unknown argument {flag!r}")
            raise SystemExit(2)
    config = uvicorn.Config(
        APP,
        loop="uvloop",
        http="httptools",
        ws="websockets-sansio",
        lifespan="off",  # the app starts its background work on import, as under daphne
        **options,  # type: ignore[arg-type]
    )
    uvicorn.Server(config).run(sockets=[sock])


def configured_server() -> str:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "conductor_web.settings.local")
    from django.conf import settings

    return str(settings.WEB_SERVER)


def configured_processes() -> int:
    """``WEB_PROCESSES`` as the settings validated it (they refuse an unusable value)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "conductor_web.settings.local")
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    try:
        return int(settings.WEB_PROCESSES)
    except ImproperlyConfigured as exc:
        log(str(exc))
        raise SystemExit(2) from None


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    daphne_args: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, daphne_args = argv[:at], argv[at + 1 :]
    parser = argparse.ArgumentParser(prog="python -m conductor_web.serve", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--backlog", type=int, default=int(os.environ.get("DAPHNE_BACKLOG") or 1024))
    parser.add_argument("--adopt", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--family", default="INET", choices=["INET", "INET6"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.adopt is not None:
        adopt(args.adopt, args.family, daphne_args)
        return
    processes = configured_processes()
    running: list[Supervisor] = []

    def on_signal(signum: int, _frame: object) -> None:
        log(f"signal {signum}: stopping")
        for supervisor in running:
            supervisor.stop()
        raise SystemExit(0)

    # Before any child starts: a stop that arrives while they start still reaches them.
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    supervisor = Supervisor(args.host, args.port, processes, args.backlog, daphne_args)
    running.append(supervisor)
    log(f"{processes} {supervisor.server} processes on {args.host}:{supervisor.port} (SO_REUSEPORT)")
    while True:
        supervisor.check()
        time.sleep(0.5)


if __name__ == "__main__":
    main()
