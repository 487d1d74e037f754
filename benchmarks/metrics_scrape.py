"""What the Prometheus benchmarks share (metrics_cost.py, metrics_dashboard.py, metrics_probe_cost.py): a free
loopback port, one scrape of an endpoint, and its memory bands by rank as the result names them."""

from __future__ import annotations

import socket
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def fetch(url: str, timeout_s: float = 5.0) -> str:
    """The exposition text of one scrape."""
    return urllib.request.urlopen(url, timeout=timeout_s).read().decode()


def bands_by_rank(text: str) -> dict[str, dict[str, float]]:
    """rank -> band name (as the result names it, `<band>_bytes`) -> bytes, parsed by prometheus-client."""
    ranks: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "gpuanat_memory_band_bytes":
            for sample in family.samples:
                ranks.setdefault(sample.labels["rank"], {})[sample.labels["band"] + "_bytes"] = sample.value
    return ranks
