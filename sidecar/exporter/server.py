"""The sidecar's own Prometheus endpoint, on a private registry: nothing else in the process
(py-spy runner, client libraries) can add to or clash with our metrics.

Listening: `127.0.0.1:19464` by default; `0.0.0.0:19464` or `[::]:19464` expose the profile
(stack-derived phase shares, process IDs) to the network: do that only behind a firewall or a
proxy. `off` (or empty) starts no endpoint.
"""

from __future__ import annotations

import errno
import socket
import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server

from sidecar.config.listen import ListenAddress, parse_listen
from sidecar.errors import ConfigError
from sidecar.exporter.collector import SidecarCollector
from sidecar.exporter.state import ExporterGroup, ExporterState


@dataclass(slots=True)
class ExporterHandle:
    """A running endpoint. `close()` stops serving and frees the port; calling it twice is fine."""

    server: WSGIServer
    thread: threading.Thread
    _closed: bool = False

    @property
    def host(self) -> str:
        return str(self.server.server_address[0])

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self, timeout: float = 5.0) -> None:
        if self._closed:
            return
        self._closed = True
        self.server.shutdown()  # returns once serve_forever has left its loop
        self.server.server_close()
        self.thread.join(timeout)


def start_exporter(
    listen: str | None, state: ExporterState | ExporterGroup
) -> ExporterHandle | None:
    """Serve `state` on `listen` from a daemon thread; None when `listen` is off."""
    address = parse_listen(listen)
    if address is None:
        return None
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SidecarCollector(state))
    try:
        server, thread = start_http_server(address.port, address.host, registry=registry)
    except OSError as error:
        raise ConfigError(_bind_failed(address, error)) from error
    return ExporterHandle(server, thread)


def _bind_failed(address: ListenAddress, error: OSError) -> str:
    where = f"port {address.port} on {address.host}"
    # The setting's three spellings, as config.py and cli.py read them.
    fix = "set exporter_listen (config file), VLLM_SIDECAR_EXPORTER_LISTEN or --exporter-listen to"
    if error.errno == errno.EADDRINUSE:
        return f"{where} is in use: {fix} a free port, or `off`"
    if error.errno == errno.EACCES:
        return f"{where} needs privileges: {fix} a port above 1023, or `off`"
    if error.errno == errno.EADDRNOTAVAIL or isinstance(error, socket.gaierror):
        return (f"{address.host} is not an address of this host ({error}): {fix} "
                "127.0.0.1:PORT, 0.0.0.0:PORT (all interfaces), or `off`")  # fmt: skip
    return f"cannot listen on {where} ({error}): {fix} another address, or `off`"
