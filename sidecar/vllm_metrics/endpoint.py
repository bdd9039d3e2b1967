"""Where a vLLM OpenAI server serves `/metrics`, read from the API server's command line.

`/metrics` is mounted at the application's root (`attach_router` in
`vllm/entrypoints/serve/instrumentator/metrics.py`). `--root-path` only tells FastAPI the prefix a
path-routing proxy strips, and Starlette routes a request whose path does not start with it
unchanged, so a scraper on the server's own host asks for `/metrics` whatever `--root-path` is.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from sidecar.errors import ConfigError

DEFAULT_PORT = 8000  # `FrontendArgs.port` (vllm/entrypoints/launchers/cli_args.py)
_FLAGS = ("--host", "--port", "--uds", "--ssl-certfile")
# `--host` unset or a wildcard: uvicorn listens on every interface, so loopback reaches it.
_ANY_V4 = ("", "0.0.0.0")
_ANY_V6 = ("::", "[::]")


class MetricsUrlError(ConfigError):
    """vLLM's command line names no `/metrics` the sidecar can reach (`--uds`, a bad `--port`).

    A ConfigError for a one-off command; the daemon, which meets it in a window of a server it
    did not configure, reads no metrics that window and says why (a counted failure)."""


def metrics_url_from_cmdline(cmdline: Sequence[str]) -> str:
    """The `/metrics` URL of the server started by `cmdline`.

    Reads `--host`, `--port` (also the `--port=8001` form) and `--ssl-certfile` (https) in both
    launch forms, `vllm serve MODEL ...` and `python -m vllm.entrypoints.openai.api_server ...`;
    the last occurrence of a flag wins, as in argparse. A command line without flags (a
    `VLLM::APIServer_0` title) gives the defaults. Flags set only in a `--config` YAML file are
    not seen: pass the URL explicitly then.
    """
    flags = _flag_values(cmdline)
    if flags.get("--uds"):
        raise MetricsUrlError(
            f"vLLM listens on the Unix socket {flags['--uds']} (--uds), which the metrics "
            "scraper cannot reach; start vLLM with --host/--port, or give the sidecar the "
            "metrics URL of a proxy in front of the socket"
        )
    scheme = "https" if flags.get("--ssl-certfile") else "http"
    return f"{scheme}://{_host(flags.get('--host'))}:{_port(flags.get('--port'))}/metrics"


def _flag_values(cmdline: Sequence[str]) -> dict[str, str]:
    """The last value of each flag we read, `--flag value` and `--flag=value` alike.

    vLLM's `FlexibleArgumentParser` accepts `--ssl_certfile` for `--ssl-certfile`, so flag names
    are compared with underscores turned into dashes.
    """
    values: dict[str, str] = {}
    args = list(cmdline)
    for index, arg in enumerate(args):
        if not arg.startswith("--"):
            continue
        name, has_value, value = arg.partition("=")
        name = name.replace("_", "-")
        if name not in _FLAGS:
            continue
        if has_value:
            values[name] = value
        elif index + 1 < len(args):
            values[name] = args[index + 1]
    return values


def _host(host: str | None) -> str:
    if host is None or host.strip() in _ANY_V4:
        return "127.0.0.1"
    if host in _ANY_V6:
        return "[::1]"
    bare = host.strip("[]")
    try:
        is_v6 = isinstance(ipaddress.ip_address(bare), ipaddress.IPv6Address)
    except ValueError:
        return host  # a host name
    if is_v6 and ipaddress.IPv6Address(bare).is_unspecified:
        return "[::1]"
    return f"[{bare}]" if is_v6 else bare


def _port(value: str | None) -> int:
    if value is None:
        return DEFAULT_PORT
    try:
        port = int(value)
    except ValueError:
        port = -1
    if not 0 < port < 65536:
        raise MetricsUrlError(
            f"--port {value!r} in vLLM's command line is not a TCP port; give the sidecar the "
            "metrics URL explicitly"
        )
    return port
