"""A test harness, not product code: the real fedzoo server in this process, on 127.0.0.1 or through WSGI without a
socket (`LoopbackServer`), for the fleet simulator (`fedzoo fl simulate`), the tests and the benchmarks. It is a
tool for running the system end to end on one machine; `fedzoo serve` is how a server runs in production.
Clients reach its WSGI transport through httpx (the client and cloud extras), which the server itself never needs."""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from fedzoo.errors import InvalidInputError

if TYPE_CHECKING:
    from fedzoo.server.config import ServerConfig

DEFAULT_ADMIN_TOKEN = "simulation-admin-token-0123456789abcdefghij"  # >= 32 bytes, as the server requires


# A simulated fleet shares one address, so the per-address rate limits (meant for a real fleet) are off; the
# per-device ones and enrollment stay as in production.
# Its data directory is thrown away at the end, so blobs are not fsynced (a durable server fsyncs every
# accepted update before answering: FEDZOO_FSYNC_BLOBS, docs/fleet-simulation.md says what that costs).
LOOPBACK_ENVIRONMENT = {**{f"FEDZOO_RATE_LIMIT_{action}_PER_ADDRESS": "off" for action in ("REGISTER", "LOOKUP", "UPLOAD")},
                        "FEDZOO_FSYNC_BLOBS": "off"}
TRANSPORTS = ("tcp", "wsgi")
LOOPBACK_POLL_S = 0.05  # how often the loopback server's thread checks for shutdown

# Transports into the server apps this process calls through WSGI, by data directory: the LoopbackServer's own
# app, or one a device process made from an InProcessServer (one more server worker on the same database, as
# gunicorn runs several).
_WSGI_APPS: dict[str, httpx.WSGITransport] = {}
_WSGI_APPS_LOCK = threading.Lock()


def _server_config(data_dir: Path, admin_token: str, viewer_token: str | None, environ: dict[str, str]) -> ServerConfig:
    from fedzoo.server.config import ServerConfig  # the server side is imported only where a server runs

    return ServerConfig.from_env(environ=environ, data_dir=data_dir, admin_token=admin_token, viewer_token=viewer_token)


@dataclass(frozen=True)
class InProcessServer:
    """How a process on this machine reaches a `LoopbackServer(transport="wsgi")` without TCP: through WSGI into
    its own instance of the app on the server's data directory (the LoopbackServer's own app in the process that
    started it; in a device worker process, one more server worker sharing the SQLite database and blob store,
    as gunicorn's workers do). Picklable, so executors ship it to their workers."""

    url: str  # the base URL requests carry (no socket is opened for it)
    data_dir: str
    admin_token: str
    viewer_token: str | None
    environ: tuple[tuple[str, str], ...]

    def transport(self) -> httpx.WSGITransport:
        """This process's transport into the app (the app is made on first use; the database is migrated already)."""
        with _WSGI_APPS_LOCK:
            if self.data_dir not in _WSGI_APPS:
                from fedzoo.server.app import create_app

                config = _server_config(Path(self.data_dir), self.admin_token, self.viewer_token, dict(self.environ))
                _WSGI_APPS[self.data_dir] = httpx.WSGITransport(app=create_app(config, migrate=False))
            return _WSGI_APPS[self.data_dir]


class LoopbackServer:
    """The real fedzoo server on 127.0.0.1 (a free port), in a thread, with the background deadline check
    `fedzoo serve` runs (every `deadline_check_s`); `restart()` keeps its data directory.

    With `transport="wsgi"` no socket is opened: clients reach the app through WSGI in the same process
    (`in_process`, given to `Simulation`), and device worker processes through their own app on the same data
    directory. What that leaves out is TCP and HTTP parsing; every request still goes through Flask, the
    authentication, the database and the blob store."""

    def __init__(self, data_dir: str | Path, admin_token: str = DEFAULT_ADMIN_TOKEN, deadline_check_s: float = 1.0,
                 environ: dict[str, str] | None = None, trusted_keys: Path | None = None,
                 viewer_token: str | None = None, transport: str = "tcp") -> None:
        """`environ`: `FEDZOO_*` settings over the loopback defaults (e.g. a short FEDZOO_DEVICE_TOKEN_TTL_S);
        `trusted_keys`: an operator key set (FEDZOO_TRUSTED_KEYS) whose signed cards the server accepts;
        `transport`: "tcp" (werkzeug on 127.0.0.1) or "wsgi" (in process, no socket)."""
        if transport not in TRANSPORTS:
            raise InvalidInputError(f"unknown transport {transport!r}; use one of {list(TRANSPORTS)}", field="transport")
        self.transport = transport
        self.data_dir = Path(data_dir)
        self.environ = {**LOOPBACK_ENVIRONMENT, **(environ or {})}
        if trusted_keys is not None:
            self.environ["FEDZOO_TRUSTED_KEYS"] = str(trusted_keys)
        self.admin_token = admin_token
        self.viewer_token = viewer_token
        self.deadline_check_s = deadline_check_s
        self.port: int | None = None
        self._server = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if self.transport == "wsgi":  # a name per data directory: clients kept per URL never mix two servers
            return f"http://fedzoo-{hashlib.sha256(str(self.data_dir.resolve()).encode()).hexdigest()[:12]}.in-process"
        return f"http://127.0.0.1:{self.port}"

    @property
    def in_process(self) -> InProcessServer | None:
        """How clients reach this server through WSGI (None over TCP)."""
        if self.transport != "wsgi":
            return None
        return InProcessServer(self.url, str(self.data_dir.resolve()), self.admin_token, self.viewer_token,
                               tuple(sorted(self.environ.items())))

    def start(self) -> LoopbackServer:
        # the server side (flask, SQLAlchemy) is imported only here: the rest of the harness needs none of it
        from werkzeug.serving import WSGIRequestHandler, make_server

        from fedzoo.server.app import create_app
        from fedzoo.server.fl.deadlines import start_deadline_watcher

        class _QuietHandler(WSGIRequestHandler):
            def log_request(self, *args: Any, **kwargs: Any) -> None:  # a simulation makes thousands of requests
                pass

        app = create_app(_server_config(self.data_dir, self.admin_token, self.viewer_token, self.environ))
        self._deadlines = start_deadline_watcher(app, self.deadline_check_s)
        if self.transport == "wsgi":
            with _WSGI_APPS_LOCK:
                _WSGI_APPS[self.in_process.data_dir] = httpx.WSGITransport(app=app)
            return self
        self._server = make_server("127.0.0.1", self.port or 0, app, threaded=True, request_handler=_QuietHandler)
        self.port = self._server.server_port
        # serve_forever checks for shutdown every poll interval: 0.05 s, not werkzeug's 0.5 s that every stop waits out
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": LOOPBACK_POLL_S},
                                        name="fedzoo-loopback", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self.transport == "wsgi":
            with _WSGI_APPS_LOCK:
                started = _WSGI_APPS.pop(self.in_process.data_dir, None)
            if started is not None:
                self._deadlines.stop()
            return
        if self._server is not None:
            self._deadlines.stop()
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=10)
            self._server = None

    def restart(self) -> None:
        """Stop and start again on the same port and data: a new app, a new round service, the same database."""
        self.stop()
        self.start()

    def __enter__(self) -> LoopbackServer:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()
