"""A tiny real HTTP server on loopback whose behaviour each test scripts (flaky, slow, truncating)."""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


class ScriptedServer:
    """Serves `handler(request_handler)` for every request; records each request's path and headers."""

    def __init__(self):
        self.requests = []
        self.handle = None
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _serve(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.requests.append({"method": self.command, "path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                                       "body": body})
                outer.handle(self)

            do_GET = do_POST = do_PUT = _serve

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def scripted_server():
    server = ScriptedServer()
    yield server
    server.close()
