"""The daemon's HTTP listeners: ``/metrics``, ``/healthz``, ``/readyz`` (``metrics.listen``) and
the console (``web.listen``), each on a small pool of its own so that a busy worker pool can
starve neither a scrape nor a page. Once per daemon: in the supervisor when
``worker.processes`` is above 1.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import structlog

from pgtick.config import Config, read_token, read_viewer_token
from pgtick.core.dbstate import METRICS_POOL_SIZE, STATEMENT_TIMEOUT_SECONDS, DatabaseProbe
from pgtick.observability.database import DatabaseCollector, PoolStatsCollector, Readiness
from pgtick.observability.metrics import Metrics
from pgtick.storage import db
from pgtick.storage.store import ClaimType, RunStore, warm_metrics_connection
from pgtick.surfaces.console.routes import SECURITY_HEADERS, Console
from pgtick.surfaces.console.server import ConsoleServer
from pgtick.surfaces.http import HttpServer, observability_routes
from pgtick.surfaces.operations.setup import WEB_POOL_SIZE

log = structlog.get_logger("pgtick.service")


class Endpoints:
    """Starts and stops the two listeners; ``stop`` undoes whatever ``start_*`` built."""

    def __init__(self, config: Config, dsn: str) -> None:
        self.config = config
        self.dsn = dsn
        self._http: HttpServer | None = None
        self._metrics_store: RunStore | None = None
        self._collector: DatabaseCollector | None = None
        self._web: ConsoleServer | None = None
        self._web_store: RunStore | None = None

    def start_http(
        self,
        pools: Mapping[str, Callable[[], Mapping[str, int]]],
        metrics: Metrics,
        limits: Sequence[ClaimType],
        last_tick_at: Callable[[], float | None],
        problem: Callable[[], str | None],
    ) -> None:
        """Serve /metrics, /healthz and /readyz from before READY=1 until the very end;
        ``metrics.listen = ""`` disables all of it (the pools' series stay registered)."""
        cfg = self.config
        pools = dict(pools)
        if not cfg.metrics.enabled:
            metrics.registry.register(PoolStatsCollector(pools))
            return
        metrics_pool = db.make_pool(
            self.dsn,
            cfg.database.schema,
            size=METRICS_POOL_SIZE,
            name="pgtick-metrics",
            on_connect=lambda conn: warm_metrics_connection(conn, STATEMENT_TIMEOUT_SECONDS),
        )
        self._metrics_store = RunStore(metrics_pool)
        pools["pgtick-metrics"] = metrics_pool.get_stats
        metrics.registry.register(PoolStatsCollector(pools))
        probe = DatabaseProbe(
            self._metrics_store,
            list(cfg.schedules.values()),
            cfg.ticker.interval_seconds,
            limits=limits,
        )
        collector = DatabaseCollector(
            probe,
            metrics.job_types,
            cfg.schedules,
            other_job_types=cfg.metrics.other_job_types,
            on_error=lambda: metrics.db_error("metrics"),
        )
        metrics.registry.register(collector)
        self._collector = collector
        # The aggregate query starts as a scrape begins and runs while the other series are
        # collected and rendered (with worker.processes above 1: every process's files merged).
        metrics.before_collect(collector.prefetch)
        readiness = Readiness(collector, last_tick_at, cfg.ticker.interval_seconds, problem=problem)
        routes = observability_routes(metrics, readiness)
        self._http = HttpServer("metrics.listen", cfg.metrics.host, cfg.metrics.port, routes)
        self._http.start()

    def start_web(self, limits: Sequence[ClaimType] = ()) -> None:
        """Serve the console (``web.listen``) on a small pool of its own, so that a page load
        never takes a connection a worker or a scrape is waiting for."""
        web = self.config.web
        if not web.enabled:
            return
        token = read_token(web)
        viewer_token = read_viewer_token(web)
        pool = db.make_pool(
            self.dsn, self.config.database.schema, size=WEB_POOL_SIZE, name="pgtick-web"
        )
        self._web_store = RunStore(pool)
        console = Console(
            self._web_store,
            token,
            viewer_token=viewer_token,
            heartbeat_seconds=self.config.worker.heartbeat_seconds,
            tick_interval_seconds=self.config.ticker.interval_seconds,
            listen_host=web.host,
            hosts=web.hosts,
            session_ttl_seconds=web.session_ttl_seconds,
            public_reads=web.public_reads,
            limits=limits,
            horizon_threshold_seconds=web.horizon_threshold_seconds,
        )
        routes = console.routes()
        self._web = ConsoleServer("web.listen", web.host, web.port, routes, SECURITY_HEADERS)
        self._web.start()
        log.info("console_listening", url=f"http://{web.listen}/", actions=token is not None)

    def stop(self) -> None:
        """The metrics server, then the console, last of all."""
        if self._collector is not None:
            self._collector.close()  # no read ahead of a scrape on a pool closing below
        if self._http is not None:
            self._http.stop()
        if self._metrics_store is not None:
            self._metrics_store.pool.close(timeout=2.0)
        if self._web is not None:
            self._web.stop()
        if self._web_store is not None:
            self._web_store.pool.close(timeout=2.0)
