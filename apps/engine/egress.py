"""Where the server may open outbound connections to model providers (issue 13).

Pure Python, no Django: the Django side parses ``settings.EGRESS_ALLOW`` into an ``EgressPolicy``
and hands it to the provider clients. Two checks use it:

* ``check_url`` at save time: the URL's shape (http/https, no userinfo, a plain host) and, when
  the host is an address in any spelling or a name that resolves now, every address it denotes.
  A name that does not resolve is accepted; it is checked again when connecting.
* ``resolve_checked`` at connect time: resolve once, check every address, and return exactly the
  checked addresses for the caller to connect to, so DNS cannot answer differently between the
  check and the connection (no rebinding window).

By default only public unicast addresses are reachable. Loopback, private, link-local, CGNAT,
multicast, unspecified and reserved ranges, and IPv6 forms that embed an IPv4 address (mapped,
compatible, 6to4, NAT64, Teredo), are refused unless an ``EGRESS_ALLOW`` rule names them.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

SETTING = "EGRESS_ALLOW"
ALLOWED_SCHEMES = ("http", "https")
_HOST_NAME = re.compile(
    r"^(?=.{1,253}\.?$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*\.?$"
)
_PORTS = re.compile(r"^(\d{1,5})(?:-(\d{1,5}))?$")

_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_V6_EMBEDDING = (
    (ipaddress.ip_network("::ffff:0:0/96"), "an IPv4-mapped IPv6 address"),
    (ipaddress.ip_network("64:ff9b::/96"), "a NAT64 address"),
    (ipaddress.ip_network("64:ff9b:1::/48"), "a NAT64 address"),
    (ipaddress.ip_network("2002::/16"), "a 6to4 address"),
    (ipaddress.ip_network("2001::/32"), "a Teredo address"),
)
_V4_COMPATIBLE = ipaddress.ip_network("::/96")
_RFC1918 = tuple(ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))


class EgressDenied(Exception):
    """A destination the policy refuses. ``str(err)`` names the address and the rule."""


class EgressConfigError(ValueError):
    """An ``EGRESS_ALLOW`` entry that cannot be parsed."""


@dataclass(frozen=True, slots=True)
class AllowRule:
    """One ``EGRESS_ALLOW`` entry: a network or a host name, optionally limited to ports."""

    network: IPNetwork | None = None
    host: str | None = None
    ports: tuple[int, int] | None = None  # inclusive; None = any port

    def _port_ok(self, port: int) -> bool:
        return self.ports is None or self.ports[0] <= port <= self.ports[1]

    def allows_address(self, address: IPAddress, port: int) -> bool:
        return (
            self.network is not None
            and address.version == self.network.version
            and address in self.network
            and self._port_ok(port)
        )

    def allows_host(self, host: str, port: int) -> bool:
        return self.host is not None and self.host == _norm_host(host) and self._port_ok(port)


def _norm_host(host: str) -> str:
    return host.strip().lower().rstrip(".")


def _parse_ports(text: str, entry: str) -> tuple[int, int]:
    m = _PORTS.match(text)
    if not m:
        raise EgressConfigError(f"{SETTING}: bad port in {entry!r} (use 8000 or 8000-8100).")
    lo = int(m.group(1))
    hi = int(m.group(2) or lo)
    if not (1 <= lo <= hi <= 65535):
        raise EgressConfigError(f"{SETTING}: bad port range in {entry!r}.")
    return lo, hi


def parse_rule(entry: str) -> AllowRule:
    """``10.0.0.0/8``, ``10.1.2.3:8000``, ``127.0.0.1:8000-8100``, ``[::1]:11434``,
    ``[fd00::/8]:80``, ``ollama.internal:11434``, ``vllm.lan`` (any port)."""
    text = entry.strip()
    if not text:
        raise EgressConfigError(f"{SETTING}: empty entry.")
    ports: tuple[int, int] | None = None
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise EgressConfigError(f"{SETTING}: unclosed '[' in {entry!r}.")
        target, rest = text[1:end], text[end + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise EgressConfigError(f"{SETTING}: expected ':port' after ']' in {entry!r}.")
            ports = _parse_ports(rest[1:], entry)
    elif text.count(":") == 1:
        target, port_text = text.split(":")
        ports = _parse_ports(port_text, entry)
    else:
        target = text  # a bare IPv6 network/address, IPv4 network/address or host name
    try:
        return AllowRule(network=ipaddress.ip_network(target, strict=False), ports=ports)
    except ValueError:
        pass
    host = _norm_host(target)
    if not _HOST_NAME.match(host) or host.replace(".", "").isdigit():
        raise EgressConfigError(f"{SETTING}: {entry!r} is neither a CIDR, an address nor a host name.")
    return AllowRule(host=host, ports=ports)


@dataclass(frozen=True, slots=True)
class EgressPolicy:
    """Hashable (clients are cached per policy). ``EgressPolicy()`` allows public addresses only."""

    allow: tuple[AllowRule, ...] = ()

    @classmethod
    def parse(cls, entries: str | Iterable[str]) -> EgressPolicy:
        items = entries.split(",") if isinstance(entries, str) else list(entries)
        return cls(tuple(parse_rule(e) for e in items if e and e.strip()))

    def host_allowed(self, host: str, port: int) -> bool:
        """An explicit host-name rule: the operator vouches for whatever that name resolves to."""
        return any(rule.allows_host(host, port) for rule in self.allow)

    def address_allowed(self, address: IPAddress, port: int) -> bool:
        return any(rule.allows_address(address, port) for rule in self.allow)

    def check_address(self, address: IPAddress, port: int, *, via: str | None = None) -> None:
        """Raise ``EgressDenied`` unless ``address:port`` is public or allowed by a rule."""
        reason = address_problem(address)
        if reason is None or self.address_allowed(address, port):
            return
        shown = f"[{address}]" if address.version == 6 else str(address)
        prefix = f"{via} resolves to {address}, which" if via else str(address)
        raise EgressDenied(
            f"{prefix} is {reason}; add {shown}:{port} (or its network) to {SETTING} "
            "to allow a self-hosted server."
        )


# What clients built without an explicit policy use. Public addresses only until the host
# application (the Django side, at app ready) installs the operator's policy.
_default_policy = EgressPolicy()


def set_default_policy(policy: EgressPolicy) -> None:
    global _default_policy
    _default_policy = policy


def default_policy() -> EgressPolicy:
    return _default_policy


def address_problem(address: IPAddress) -> str | None:
    """Why connecting to ``address`` is refused by default, or None for a public unicast address."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.scope_id:
            address = ipaddress.IPv6Address(str(address).split("%", 1)[0])
        for network, label in _V6_EMBEDDING:
            if address in network:
                return f"{label} (it embeds {_embedded_v4(address)})"
        if address.is_unspecified:
            return "unspecified"
        if address.is_loopback:
            return "loopback"
        if address in _V4_COMPATIBLE:
            return f"an IPv4-compatible IPv6 address (it embeds {_embedded_v4(address)})"
        if address.is_link_local:
            return "link-local"
        if address.is_multicast:
            return "multicast"
        if address.is_site_local or address in ipaddress.ip_network("fc00::/7"):
            return "private (unique/site-local)"
        if address.is_reserved:
            return "reserved"
        if not address.is_global:
            return "not a public address (special-purpose range)"
        return None
    if address.is_unspecified or address in ipaddress.ip_network("0.0.0.0/8"):
        return "unspecified (0.0.0.0/8)"
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local (169.254.0.0/16, where cloud metadata services live)"
    if address in _CGNAT:
        return "shared address space (CGNAT, 100.64.0.0/10)"
    if address.is_multicast:
        return "multicast"
    if address == ipaddress.IPv4Address("255.255.255.255") or address.is_reserved:
        return "reserved"
    if any(address in n for n in _RFC1918):
        return "private"
    if not address.is_global:
        return "not a public address (special-purpose range)"
    return None


def _embedded_v4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address:
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)  # mapped, compatible, NAT64


def literal_address(host: str) -> IPAddress | None:
    """The address ``host`` denotes without DNS, in every spelling the C resolver accepts:
    dotted, decimal (``2130706433``), octal (``0177.0.0.1``), hex (``0x7f.1``), short (``127.1``),
    and IPv6 literals (with or without brackets, with a zone)."""
    h = host.strip().strip("[]")
    if ":" in h:
        try:
            return ipaddress.IPv6Address(h)
        except ValueError:
            return None
    h = h.rstrip(".")
    if not h or not re.fullmatch(r"[0-9a-fA-FxX.]+", h):
        return None
    try:
        # inet_aton implements the classic BSD forms the resolver (getaddrinfo) also accepts.
        return ipaddress.IPv4Address(socket.inet_aton(h))
    except OSError:
        return None


def _default_port(scheme: str) -> int:
    return 443 if scheme == "https" else 80


@dataclass(frozen=True, slots=True)
class Target:
    scheme: str
    host: str
    port: int


def parse_url(url: str) -> Target:
    """The (scheme, host, port) a base URL connects to. Raises ``EgressDenied`` on a URL shape we
    refuse: other schemes, userinfo, backslashes/whitespace/control characters, odd hosts."""
    if not url or any(c.isspace() or ord(c) < 32 or c == "\\" for c in url):
        raise EgressDenied("The base URL must be a plain http(s) URL without spaces or backslashes.")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise EgressDenied("The base URL has an invalid host or port.") from None
    scheme = parts.scheme.lower()
    if scheme not in ALLOWED_SCHEMES:
        raise EgressDenied(f"The base URL must use http:// or https:// (not {scheme or 'no scheme'}://).")
    if "@" in parts.netloc:
        raise EgressDenied("The base URL must not contain a user name or password (user@host).")
    host = parts.hostname or ""
    if not host:
        raise EgressDenied("The base URL has no host.")
    if literal_address(host) is None and not _HOST_NAME.match(host):
        raise EgressDenied(
            f"The base URL's host {host!r} is not a valid host name (use ASCII/punycode names)."
        )
    return Target(scheme, host, port or _default_port(scheme))


def check_url(url: str, policy: EgressPolicy, *, resolve: bool = True) -> None:
    """Save-time check of a base URL. Raises ``EgressDenied`` naming the address and the rule.

    A literal address is checked in whatever spelling it is written. A host name is resolved when
    ``resolve`` is true; one that does not resolve now is accepted (checked again at connect time).
    """
    target = parse_url(url)
    address = literal_address(target.host)
    if address is not None:
        policy.check_address(address, target.port)
        return
    if policy.host_allowed(target.host, target.port) or not resolve:
        return
    try:
        infos = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return
    for info in infos:
        policy.check_address(_info_address(info), target.port, via=target.host)


def _info_address(info: tuple) -> IPAddress:  # type: ignore[type-arg]
    family, sockaddr = info[0], info[4]
    if family == socket.AF_INET6:
        return ipaddress.IPv6Address(str(sockaddr[0]).split("%", 1)[0])
    return ipaddress.ip_address(sockaddr[0])


def resolve_checked(host: str, port: int, policy: EgressPolicy) -> list[tuple]:  # type: ignore[type-arg]
    """Connect-time check: ``getaddrinfo`` results for ``host:port``, all of which the policy
    allows. Connect only to these sockaddrs. Raises ``EgressDenied`` if any address is refused
    (a name that resolves to a public and a private address is refused as a whole)."""
    literal = literal_address(host)
    if literal is not None:
        # Whatever the resolver makes of an odd spelling (trailing dot…), judge what it denotes.
        policy.check_address(literal, port)
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    if policy.host_allowed(host, port):
        return list(infos)
    shown_host = None if literal is not None else host
    for info in infos:
        policy.check_address(_info_address(info), port, via=shown_host)
    return list(infos)
