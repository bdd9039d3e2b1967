"""One window, every stage, in the order they run (`profile_window` reads top to bottom):

    sample     py-spy over the deployment's process tree, in segments   (sampler, pyspy)
    parse      each segment's `record -f raw` text into stacks          (parsers.parse_raw)
    classify   each distinct stack to a role, phase and stage           (classifier)
    aggregate  phase shares per role and main thread, stage counts      (aggregate)
    readings   psutil, NVML, vLLM's /metrics, the KV cache's size,
               the operator's custom metrics                            (readers)
    fingerprint  what the target ran: read once per target, plus the
               window's attention backend and GPUs                      (fingerprint)
    snapshot   the frozen record of it all                              (snapshot)
    write      the caller's: `writers.write_snapshot` for `snapshot`, the store for `run`,
               which may skip a write on a full disk and counts that

Used by `snapshot` (one window) and `run` (windows on a schedule). A reader that fails leaves
its part of the snapshot empty with a reason; only the sampler's failed start is fatal
(STYLE.md 7).
"""

from __future__ import annotations

from collections.abc import Callable

from sidecar.classify.classifier import Classifier
from sidecar.sampling.sampler import Sampler
from sidecar.target.discovery import Deployment
from sidecar.target.serveflags import deployment_name
from sidecar.window.readers import SegmentLaps, WindowReaders
from sidecar.window.snapshot import Snapshot, build_snapshot


def profile_window(
    target: Deployment,
    sampler: Sampler,
    classifier: Classifier,
    readers: WindowReaders,
    duration_s: float,
    stop: Callable[[], bool] = lambda: False,
    host: str | None = None,
) -> Snapshot:
    """Sample `target` for `duration_s` and turn it into a snapshot, stage by stage."""
    started = readers.start(target)  # CPU times, the first /metrics scrape, the GPUs' start
    # Each segment's CPU per role and vLLM's counters too: the units `diff` compares.
    # The first lap starts from the window's first scrape, and the window's figures end at the
    # last lap's: a segment boundary costs one scrape, the window no extra one.
    laps = SegmentLaps(target.processes, readers.metrics, readers.take, readers.cpu,
                       first=started.scrape)  # fmt: skip
    # sample + parse: py-spy records a segment, its raw text is parsed as the segment ends
    # (the text lives in py-spy's temporary file), identical stacks are counted together.
    window = sampler.window(duration_s, stop, laps)
    readings = readers.finish(started, target, window, last=laps.last_scrape)  # the same window
    fingerprint = readers.fingerprint(target, window, readings, classifier.rules)
    # classify -> aggregate -> snapshot (also what recorded windows go through in the tests)
    return build_snapshot(window, target.processes, classifier, host, readings,
                          deployment=deployment_of(target), fingerprint=fingerprint)  # fmt: skip


def deployment_of(target: Deployment) -> str | None:
    """`model@port` from the API server's command line; None without an API server."""
    api = target.api_server
    return deployment_name(api.cmdline) if api else None
