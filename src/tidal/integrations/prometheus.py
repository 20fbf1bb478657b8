"""The loader's metrics as a Prometheus text endpoint (``prometheus_client``, the ``prometheus`` extra).

>>> from tidal.integrations import prometheus
>>> server = prometheus.serve(loader, port=9108)           # http://host:9108/metrics
>>> registry.register(prometheus.collector(loader))        # or on a registry of one's own

Each scrape reads ``loader.metrics()`` afresh. Counts (records, batches, tokens, bytes,
retries, cache hits, skipped records, seconds waited) are counters, ``tidal_records_total``;
the rest (``data_wait_share``, ``tokens_per_s``, ``seconds``) gauges, ``tidal_data_wait_share``.
Per mixed stream: ``tidal_stream_tokens_total{stream="web"}``, ``tidal_stream_records_total``
and the gauge ``tidal_stream_weight``. Every sample carries a ``rank`` label.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from tidal.errors import needs
from tidal.world import World

_client = needs("prometheus_client", "tidal.integrations.prometheus", "prometheus")
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily  # noqa: E402
from prometheus_client.metrics_core import Metric  # noqa: E402
from prometheus_client.registry import Collector, CollectorRegistry  # noqa: E402

__all__ = ["Server", "collector", "serve"]

GAUGES = {"data_wait_share", "tokens_per_s", "seconds"}
PER_STREAM = {"tokens": "counter", "records": "counter", "weight": "gauge"}


def _name(key: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", key)


class LoaderCollector(Collector):
    """Collects ``loader.metrics()`` at every scrape, as ``{prefix}{name}`` samples."""

    def __init__(self, loader: Any, prefix: str = "tidal_", rank: int | None = None):
        self.loader, self.prefix = loader, prefix
        self.rank = str(World.ranks().rank if rank is None else rank)

    def collect(self) -> Iterator[Metric]:
        metrics = self.loader.metrics()
        streams: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
        for key, value in metrics.items():
            what, _, stream = key.partition("/")
            if stream:
                kind = PER_STREAM.get(what)
                if kind is None:
                    continue
                family = streams.get(what)
                if family is None:
                    name = f"{self.prefix}stream_{_name(what)}"
                    doc = f"loader.metrics()['{what}/<stream>']"
                    family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
                        name, doc, labels=["rank", "stream"]
                    )
                    streams[what] = family
                family.add_metric([self.rank, stream], float(value))
                continue
            name, doc = self.prefix + _name(key), f"loader.metrics()['{key}']"
            gauge = key in GAUGES
            family = (GaugeMetricFamily if gauge else CounterMetricFamily)(name, doc, labels=["rank"])
            family.add_metric([self.rank], float(value))
            yield family
        yield from streams.values()


def collector(loader: Any, prefix: str = "tidal_", rank: int | None = None) -> LoaderCollector:
    """A collector of ``loader.metrics()`` to register on a ``prometheus_client`` registry;
    ``rank`` labels the samples (default: this process's rank)."""
    return LoaderCollector(loader, prefix, rank)


class Server:
    """An HTTP endpoint serving the metrics in Prometheus's text format, in a daemon thread."""

    def __init__(self, registry: CollectorRegistry, port: int, addr: str):
        self._httpd, self._thread = _client.start_http_server(port, addr=addr, registry=registry)
        self.addr = addr
        self.port: int = self._httpd.server_port

    @property
    def url(self) -> str:
        return f"http://{self.addr}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and free the port."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def serve(loader: Any, port: int = 0, addr: str = "127.0.0.1", prefix: str = "tidal_") -> Server:
    """Serve ``loader.metrics()`` at ``http://addr:port/metrics`` (``port=0``: a free port,
    read back from ``server.port``) until ``server.close()``; on a registry of its own, so
    nothing else of the process is exposed. ``addr="0.0.0.0"`` serves beyond this machine.

    >>> server = serve(loader, port=9108)
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector(loader, prefix))
    return Server(registry, port, addr)
