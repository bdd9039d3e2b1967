"""The exporter's listen address, parsed in one place: the config layer checks it at start and on
SIGHUP, and the exporter binds what it returns.

`127.0.0.1:19464` by default; `0.0.0.0:19464` or `[::]:19464` expose the profile (stack-derived
phase shares, process IDs) to the network: do that only behind a firewall or a proxy. `off`
(or empty) starts no endpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.errors import ConfigError

DEFAULT_HOST = "127.0.0.1"
# YAML 1.1 reads a bare `off` or `no` as false; the config layer hands that on as "false".
OFF = ("", "off", "none", "false", "no")
FORMS = "write host:port (127.0.0.1:19464, [::1]:19464, :19464) or `off`"


@dataclass(frozen=True, slots=True)
class ListenAddress:
    host: str
    port: int


def parse_listen(listen: str | None) -> ListenAddress | None:
    """`host:port`, `[v6]:port`, `:port` or `port` (both 127.0.0.1); `off` or empty: None."""
    try:
        return listen_address(listen)
    except ValueError as exc:
        raise ConfigError(f"exporter listen address {listen!r} {exc}: {FORMS}") from None


def listen_address(listen: str | None) -> ListenAddress | None:
    """As `parse_listen`, but a bad address is a ValueError saying what is wrong with it, for a
    caller that names the setting and what fits (`FORMS`) itself."""
    text = (listen or "").strip()
    if text.lower() in OFF:
        return None
    host, port = _split(text)
    if not port.isascii() or not port.isdigit() or int(port) > 65535:
        raise ValueError("has no valid port")
    return ListenAddress(host or DEFAULT_HOST, int(port))


def _split(text: str) -> tuple[str, str]:
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
        if not sep or not host:
            raise ValueError("is not a bracketed IPv6 address with a port")
        return host, port
    if text.count(":") > 1:
        raise ValueError("has an IPv6 address without brackets")
    host, _, port = text.rpartition(":")
    return host, port
