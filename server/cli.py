"""`fedzoo serve`: migrate the registry, import a zoo, then run gunicorn with several workers.

Gunicorn (not Flask's development server) runs the app: `--workers` processes with `--threads`
threads each (gthread workers, so clients keep connections alive). Shutdown is graceful on SIGTERM
and on SIGINT (Ctrl-C) alike: the master stops accepting, workers finish the requests in flight
(up to `GRACEFUL_TIMEOUT_S`), stop their background deadline check (finishing an aggregation it
runs), then exit.
"""

from __future__ import annotations

import multiprocessing
import signal
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import click
from gunicorn.app.base import BaseApplication
from gunicorn.arbiter import Arbiter

# Only light imports here: this process becomes gunicorn's master, and forks the workers. The app (and with
# it onnxruntime, which from 1.30 starts a thread when imported) is imported in each worker after the fork
# (`ServerApplication.load`) and in a spawned child for the import; a worker forked from a master holding
# onnxruntime's state aborts when it exits ("terminate called after throwing std::system_error").
from fedzoo.server.config import ServerConfig

GRACEFUL_TIMEOUT_S = 20
REQUEST_TIMEOUT_S = 60


class GracefulArbiter(Arbiter):
    """Gunicorn's master, with SIGINT meaning the same graceful stop as SIGTERM."""

    def handle_int(self) -> None:
        self.handle_term()


def _graceful_worker_signals(worker: Any) -> None:
    # Gunicorn workers quit at once on SIGINT; a Ctrl-C reaches them too, so make it finish requests.
    signal.signal(signal.SIGINT, worker.handle_exit)


def _stop_background_work(server: Any, worker: Any) -> None:
    """gunicorn's worker_exit hook: stop the deadline watcher (letting an aggregation it runs finish)
    before the interpreter exits. A daemon thread still inside onnxruntime when the interpreter tears
    down makes the C++ runtime call std::terminate: the SIGABRT "terminate called ..." on SIGTERM."""
    watcher = getattr(worker.app, "deadline_watcher", None)
    if watcher is not None:
        watcher.stop()


_serving = threading.local()  # the gunicorn request each worker thread is answering


def _remember_request(worker: Any, request: Any) -> None:
    """gunicorn's pre_request hook: keep the request, so the app's `Connection: close` can reach it."""
    _serving.request = request


def honour_connection_close(app: Callable) -> Callable:
    """Gunicorn drops a `Connection` header set by the app (it is hop-by-hop) and keeps the connection
    alive even when the body went unread; mark its request for closing instead, so it answers
    `Connection: close` and a client's next request opens a fresh connection."""

    def application(environ: dict[str, Any], start_response: Callable) -> Any:
        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            if any(name.lower() == "connection" and value.lower() == "close" for name, value in headers):
                request = getattr(_serving, "request", None)
                if request is not None:
                    request.must_close = True
            return start_response(status, headers, exc_info)

        return app(environ, start)

    return application


class ServerApplication(BaseApplication):
    """Gunicorn configured in code; each worker builds its own app (own database connections)."""

    def __init__(self, config: ServerConfig, options: dict[str, Any]) -> None:
        self.server_config = config
        self.options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            self.cfg.set(key, value)

    def load(self):  # called in each worker after the fork
        from fedzoo.server.app import create_app
        from fedzoo.server.fl.deadlines import start_deadline_watcher

        app = create_app(self.server_config, migrate=False)
        self.deadline_watcher = start_deadline_watcher(app)  # stopped by _stop_background_work
        return honour_connection_close(app)

    def run(self) -> None:
        GracefulArbiter(self).run()


def _prepare_and_import(config: ServerConfig, zoo_dir: Path | None) -> tuple[tuple[int, int], tuple[int, int] | None]:
    """`prepare_and_import`, imported only here: it runs in a spawned child (or alone, with --import-only)."""
    from fedzoo.server.registry_import import prepare_and_import

    return prepare_and_import(config, zoo_dir)


def base_url(host: str, port: int) -> str:
    """The URL a browser on this machine opens; an IPv6 host goes in brackets."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@click.command("serve")
@click.option("--zoo", "zoo_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Import this zoo directory (cards + blobs) before serving.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535))
@click.option("--workers", default=2, show_default=True, type=click.IntRange(1, 64), help="Worker processes.")
@click.option("--threads", default=2, show_default=True, type=click.IntRange(1, 256), help="Threads per worker.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Registry database and blobs (default $FEDZOO_DATA_DIR or ~/.fedzoo/server).")
@click.option("--import-only", is_flag=True, help="Migrate and import the zoo, then exit without serving.")
@click.option("--access-log", is_flag=True, help="Log every request to stderr.")
def serve(zoo_dir: Path | None, host: str, port: int, workers: int, threads: int, data_dir: Path | None,
          import_only: bool, access_log: bool) -> None:
    """Run the model server: registry, blobs, lookup, telemetry and FL rounds over REST, and the operator's
    dashboard at /ui (its URL is printed at start)."""
    config = ServerConfig.from_env(data_dir=data_dir)
    # Migrating and importing compute model costs with onnxruntime. Done in this process, its thread pools
    # would be inherited, dead, by every forked worker, which then aborts ("terminate called after throwing
    # std::system_error") when it exits on SIGTERM. A spawned child keeps the master free of onnxruntime.
    if import_only:  # nothing is forked afterwards: no need for the child
        (refreshed_models, refreshed_devices), imported = _prepare_and_import(config, zoo_dir)
    else:
        with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as child:
            (refreshed_models, refreshed_devices), imported = child.submit(_prepare_and_import, config, zoo_dir).result()
    if refreshed_models or refreshed_devices:
        click.echo(f"recomputed latency estimates of {refreshed_models} models and {refreshed_devices} devices")
    if imported is not None:
        total, created = imported
        click.echo(f"imported {zoo_dir}: {total} models ({created} new)")
    if import_only:
        return
    options = {
        "bind": f"{host}:{port}",
        "workers": workers,
        "worker_class": "gthread",
        "threads": threads,
        "graceful_timeout": GRACEFUL_TIMEOUT_S,
        "timeout": REQUEST_TIMEOUT_S,
        "keepalive": 30,
        "post_worker_init": _graceful_worker_signals,
        "pre_request": _remember_request,
        "worker_exit": _stop_background_work,
        "accesslog": "-" if access_log else None,
        "errorlog": "-",
        "proc_name": "fedzoo-serve",
        "control_socket_disable": True,  # one fixed socket path would clash between servers on one machine
    }
    click.echo(f"serving {config.data_dir} on {base_url(host, port)} with {workers} workers x {threads} threads")
    click.echo(f"dashboard: {base_url(host, port)}/ui/ (log in with FEDZOO_VIEWER_TOKEN or FEDZOO_ADMIN_TOKEN)")
    ServerApplication(config, options).run()
