"""The sidecar's own Prometheus endpoint, so an existing Prometheus can scrape a fleet of them.

state      ExporterState / ExporterView: what the daemon pushes, replaced whole
collector  SidecarCollector: one scrape's metric families from one view
server     start_exporter / parse_listen: the HTTP endpoint on a private registry
"""

from sidecar.exporter.collector import HELP, PREFIX, SidecarCollector
from sidecar.exporter.server import ExporterHandle, start_exporter
from sidecar.exporter.state import ExporterGroup, ExporterState, ExporterView

__all__ = [
    "HELP",
    "PREFIX",
    "ExporterGroup",
    "ExporterHandle",
    "ExporterState",
    "ExporterView",
    "SidecarCollector",
    "start_exporter",
]
