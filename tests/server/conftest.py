"""Fixtures of the server tests (`server_config`, `live_server`); helpers live in server_helpers.py."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests/ has no packages; make server_helpers importable

from server_helpers import LiveServer, running_live_server, config_for_tests  # noqa: E402

from fedzoo.server.config import ServerConfig  # noqa: E402


@pytest.fixture
def server_config(tmp_path: Path) -> ServerConfig:
    return config_for_tests(tmp_path)


@pytest.fixture
def live_server(server_config: ServerConfig) -> Iterator[LiveServer]:
    """A fresh registry behind a real HTTP server on loopback (werkzeug, threaded)."""
    with running_live_server(server_config) as server:
        yield server
