"""The proxy for an apiserver from the environment, as client-go (Go's httpproxy) reads it.

HTTPS_PROXY (or https_proxy) for an https server, HTTP_PROXY (http_proxy) for http; a
proxy without a scheme is http://. Never for localhost or a loopback address. NO_PROXY
(or no_proxy) is a comma-separated list, each entry lower-cased and trimmed:

* ``*`` alone: no proxy for anything;
* an IP address or a CIDR (``10.0.0.0/8``, ``fd00::/8``): that address or range; an
  address may carry a port (``10.1.2.3:6443``, ``[::1]:6443``), then only that port;
* a domain (``corp.example``): itself and its subdomains; with a leading dot
  (``.corp.example``) its subdomains only; ``*.corp.example`` is ``.corp.example``;
  either may carry a port (``corp.example:6443``), then only that port.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass

__all__ = ["environment_proxy", "no_proxy_matches"]

_IP = ipaddress.IPv4Address | ipaddress.IPv6Address


def environment_proxy(server: str) -> str | None:
    """The proxy for ``server`` (a URL), or None: go straight to it."""
    scheme, _, rest = server.partition("://")
    names = ("HTTPS_PROXY", "https_proxy") if scheme == "https" else ("HTTP_PROXY",
                                                                       "http_proxy")
    proxy = next((os.environ[n] for n in names if os.environ.get(n)), None)
    if proxy is None:
        return None
    host, port = _split(rest.split("/", 1)[0].rsplit("@", 1)[-1])
    port = port or ("443" if scheme == "https" else "80")
    no_proxy = os.environ.get("NO_PROXY") or os.environ.get("no_proxy") or ""
    if not host or no_proxy_matches(no_proxy, host, port):
        return None
    return proxy if "://" in proxy else f"http://{proxy}"


def no_proxy_matches(no_proxy: str, host: str, port: str) -> bool:
    """Whether a request to ``host``:``port`` goes without a proxy (Go's useProxy, negated)."""
    host = host.strip().lower()
    ip = _ip(host)
    if host == "localhost" or (ip is not None and ip.is_loopback):
        return True
    for entry in (e.strip().lower() for e in no_proxy.split(",")):
        if not entry:
            continue
        if entry == "*":
            return True
        if "/" in entry:
            try:
                network = ipaddress.ip_network(entry, strict=False)
            except ValueError:
                continue  # neither a CIDR nor a domain: Go ignores it too
            if ip is not None and ip.version == network.version and ip in network:
                return True
            continue
        if _entry(entry).matches(host, ip, port):
            return True
    return False


@dataclass(frozen=True)
class _Entry:
    host: str  # an IP address, or a domain with a leading dot
    port: str  # "" for any port
    ip: _IP | None
    match_host: bool  # a domain without a leading dot: also the domain itself

    def matches(self, host: str, ip: _IP | None, port: str) -> bool:
        if self.port and self.port != port:
            return False
        if self.ip is not None:
            return ip is not None and ip == self.ip
        return host.endswith(self.host) or (self.match_host and host == self.host[1:])


def _entry(text: str) -> _Entry:
    host, port = _split(text)
    ip = _ip(host)
    if ip is not None:
        return _Entry(host, port, ip, False)
    if host.startswith("*."):
        host = host[1:]
    match_host = not host.startswith(".")
    return _Entry(host if not match_host else "." + host, port, None, match_host)


def _split(hostport: str) -> tuple[str, str]:
    """host and port ("" if none) of ``host``, ``host:port``, ``[v6]``, ``[v6]:port``, ``v6``."""
    if hostport.startswith("["):
        host, _, rest = hostport[1:].partition("]")
        return host, rest[1:] if rest.startswith(":") else ""
    if hostport.count(":") == 1:
        host, _, port = hostport.partition(":")
        return host, port
    return hostport, ""  # no port, or a bare IPv6 address


def _ip(host: str) -> _IP | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None
