"""Fixtures of the server tests (`server_config`, `live_server`, and for round tests a loopback `server` with a
`simulation` of the `federation` on it); helpers live in server_helpers.py and fl_helpers.py."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests/ has no packages; make server_helpers importable

from fl_helpers import ready_simulation  # noqa: E402
from server_helpers import LiveServer, running_live_server, config_for_tests  # noqa: E402
from zoo_helpers import build_tiny_zoo  # noqa: E402

from fedzoo.server.config import ServerConfig  # noqa: E402
from fedzoo.zoo import Zoo  # noqa: E402


@pytest.fixture
def server_config(tmp_path: Path) -> ServerConfig:
    return config_for_tests(tmp_path)


@pytest.fixture
def live_server(server_config: ServerConfig) -> Iterator[LiveServer]:
    """A fresh registry behind a real HTTP server on loopback (werkzeug, threaded)."""
    with running_live_server(server_config) as server:
        yield server


@pytest.fixture
def server(request: pytest.FixtureRequest, tmp_path: Path):
    """The real server app on a loopback port (`LoopbackServer`), its data in tmp_path, with the options of the
    test module's `LOOPBACK_SERVER_OPTIONS` (e.g. a short deadline check, a viewer token) where it sets them."""
    from fedzoo.server.testing import LoopbackServer

    with LoopbackServer(tmp_path / "server", **getattr(request.module, "LOOPBACK_SERVER_OPTIONS", {})) as running:
        yield running


@pytest.fixture
def simulation(federation, server, tmp_path: Path):
    """The federation's base model published on `server` and its devices registered."""
    with ready_simulation(federation, server.url, tmp_path / "devices") as sim:
        yield sim


@pytest.fixture(scope="session")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Zoo:
    """The zoo-wide round tests' tiny zoo (zoo_helpers.build_tiny_zoo), built once per test process: no test
    changes it (the compressed one is a copy)."""
    return build_tiny_zoo(tmp_path_factory.mktemp("zoo") / "zoo")
