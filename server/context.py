"""What every request handler works with: settings, database, blob store and latency estimator."""

from __future__ import annotations

from dataclasses import dataclass, field

from fedzoo.server.blobstore import BlobStore
from fedzoo.server.config import ServerConfig
from fedzoo.server.db import Database
from fedzoo.server.devices import DeviceCache, LastSeenRecorder
from fedzoo.server.latency import LatencyEstimator


@dataclass
class ServerContext:
    config: ServerConfig
    db: Database
    store: BlobStore
    estimator: LatencyEstimator
    devices: DeviceCache = field(default_factory=DeviceCache)
    last_seen: LastSeenRecorder = field(default_factory=LastSeenRecorder)
