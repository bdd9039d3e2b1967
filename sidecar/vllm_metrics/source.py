"""The metrics fetcher, an OS boundary behind a one-method Protocol (STYLE.md, point 9).

`take_scrape` is the only caller the sampling loop needs: whatever the source does (refused
connection, 404, HTML from a proxy, a timeout, a bug), it returns a `MetricsScrape`, failed or
not, and never raises into the loop.
"""

from __future__ import annotations

import http.client
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from sidecar.errors import ConfigError, SidecarError
from sidecar.records.redact import redact_url
from sidecar.vllm_metrics.scrape import MetricsScrape, failed_scrape, parse_scrape

DEFAULT_TIMEOUT_S = 2.0
# A vLLM scrape is ~60 kB (600 lines, one engine); 256 engines' worth is still far below this.
MAX_BYTES = 32 * 1024 * 1024
_NOT_PROMETHEUS = ("text/html", "application/json", "application/xml", "text/xml")


class ScrapeError(SidecarError):
    """A scrape that failed. Raised by a `MetricsSource`, caught by `take_scrape`."""


class MetricsSource(Protocol):
    @property
    def url(self) -> str: ...

    def fetch(self) -> str:
        """The text of one `/metrics` answer; raises `ScrapeError` when there is none."""
        ...


@dataclass(frozen=True, slots=True)
class HttpMetricsSource:
    """GET `url` with urllib. Environment proxies are ignored: an operator scrapes the vLLM on
    its own host, and `http_proxy` in a container's environment must not reroute that."""

    url: str
    timeout_s: float = DEFAULT_TIMEOUT_S
    vllm: bool = True  # False: another exporter (a custom metric's URL); its errors say so
    _opener: urllib.request.OpenerDirector = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if urllib.parse.urlsplit(self.url).scheme not in ("http", "https"):
            shown = redact_url(self.url)
            raise ConfigError(f"metrics URL {shown!r} must start with http:// or https://")
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        object.__setattr__(self, "_opener", opener)

    def fetch(self) -> str:
        # Ask for the classic text format: with an OpenMetrics Accept header prometheus_client
        # would answer OpenMetrics, whose counters and `# EOF` read differently.
        request = urllib.request.Request(self.url, headers={"Accept": "text/plain"})
        shown = redact_url(self.url)  # what messages name: no password or token of the URL
        try:
            with self._opener.open(request, timeout=self.timeout_s) as response:
                content_type = response.headers.get_content_type()
                body: bytes = response.read(MAX_BYTES + 1)
                # read(n) returns short, without IncompleteRead, when the peer hangs up early.
                expected = response.headers.get("Content-Length", "")
        except urllib.error.HTTPError as error:
            raise ScrapeError(
                _http_status_message(shown, error.code, error.reason, vllm=self.vllm)
            ) from None
        except http.client.IncompleteRead as error:
            raise ScrapeError(
                f"garbage: truncated answer from {shown} ({len(error.partial)} bytes read, "
                f"{error.expected} more expected)"
            ) from None
        except (OSError, http.client.HTTPException, ValueError) as error:
            raise ScrapeError(f"no /metrics at {shown}: {_why(error, self.vllm)}") from None
        if expected.isdigit() and len(body) < int(expected):
            raise ScrapeError(
                f"garbage: truncated answer from {shown} ({len(body)} bytes read, "
                f"{int(expected) - len(body)} more expected)"
            )
        return _decode(shown, content_type, body)


def take_scrape(
    source: MetricsSource,
    clock: Callable[[], float] = time.monotonic,
    wall_clock: Callable[[], float] = time.time,
    *,
    vllm: bool = True,
    only: tuple[str, ...] = (),
) -> MetricsScrape:
    """Fetch and parse one scrape; a failure is returned as a scrape with `error` set.
    `vllm` False: any exporter's text is accepted (a custom metric's other URL). `only`: parse
    just the metric families of these names (and their `_total`, `_bucket`, ... samples): the
    hang watch's scrape every few seconds, where parsing vLLM's whole text (8 ms of CPU here
    for about 600 lines) would be most of its cost."""
    started, wall = clock(), wall_clock()
    text, failure = _fetch(source)
    ended = clock()
    taken_at, fetch_s = (started + ended) / 2, ended - started
    url = redact_url(source.url)  # what the scrape records and the summary writes
    if failure is not None:
        return failed_scrape(url, failure, taken_at=taken_at, wall=wall, fetch_s=fetch_s)
    if only:
        text = _only(text, only)
    return parse_scrape(text, url=url, taken_at=taken_at, wall=wall, fetch_s=fetch_s,
                        vllm=vllm)  # fmt: skip


def _only(text: str, names: tuple[str, ...]) -> str:
    """The lines of `text` of the families `names`: samples, and their # TYPE and # HELP."""
    keep = []
    for line in text.splitlines():
        name = line[7:] if line.startswith(("# TYPE ", "# HELP ")) else line
        if name.startswith(names):
            keep.append(line)
    return "\n".join(keep) + "\n"


def _fetch(source: MetricsSource) -> tuple[str, str | None]:
    """(text, None), or ("", why not)."""
    try:
        return source.fetch(), None
    except ScrapeError as error:
        return "", str(error)
    except Exception as error:  # a source is an OS boundary: nothing it does may stop the loop
        return "", f"scrape of {source.url} failed: {type(error).__name__}: {error}"


def _http_status_message(url: str, status: int, reason: object, *, vllm: bool = True) -> str:
    if status == 404 and vllm:
        return (
            f"no /metrics at {url}: HTTP 404 (the demo server `python -m "
            "vllm.entrypoints.api_server` has no /metrics; profile the OpenAI server, `vllm "
            "serve` or `python -m vllm.entrypoints.openai.api_server`)"
        )
    return f"no /metrics at {url}: HTTP {status} {reason}"


def _why(error: BaseException, vllm: bool = True) -> str:
    if isinstance(error, urllib.error.URLError) and isinstance(error.reason, BaseException):
        error = error.reason
    if isinstance(error, ConnectionRefusedError):
        who = "vLLM" if vllm else "the exporter"
        return f"connection refused (is {who} running, on this host and port?)"
    if isinstance(error, TimeoutError):
        return "no answer within the timeout"
    return f"{type(error).__name__}: {error}"


def _decode(url: str, content_type: str, body: bytes) -> str:
    if content_type in _NOT_PROMETHEUS:
        start = body[:80].decode("utf-8", errors="replace")
        raise ScrapeError(f"garbage: {url} answered {content_type}, not Prometheus text: {start!r}")
    if len(body) > MAX_BYTES:
        raise ScrapeError(f"garbage: {url} answered more than {MAX_BYTES} bytes")
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ScrapeError(f"garbage: {url} answered bytes that are not UTF-8 ({error})") from None
