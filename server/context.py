"""What every request handler works with: settings, database, blob store, latency estimator, rate limiter,
signing keys."""

from __future__ import annotations

from dataclasses import dataclass

from fedzoo.server.blobstore import BlobStore
from fedzoo.server.card_keys import FleetKeys
from fedzoo.server.config import ServerConfig
from fedzoo.server.db import Database
from fedzoo.server.devices import LastSeenRecorder
from fedzoo.server.latency import LatencyEstimator
from fedzoo.server.ratelimit import RateLimiter


@dataclass
class ServerContext:
    config: ServerConfig
    db: Database
    store: BlobStore
    estimator: LatencyEstimator
    limiter: RateLimiter
    keys: FleetKeys
    last_seen: LastSeenRecorder
