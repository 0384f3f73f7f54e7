"""`OperatorClient`: the device SDK's client plus the operator's REST calls that take the admin token (start
rounds, publish blobs and models, create enrollment tokens), for operator tools, the simulator, the demo and tests.

These live here, not in `FedzooClient`: a device never holds the admin token, so the device SDK has no admin calls.

    with OperatorClient("http://127.0.0.1:8000", cache_dir="/tmp/fedzoo-admin") as operator:
        operator.publish_model(card, {card.sha256: onnx_bytes}, admin_token)
        enrollment_token = operator.create_enrollment_token(admin_token, max_uses=50)["token"]
        round_id = operator.create_rounds({"model_id": card.id, ...}, admin_token)["id"]
"""

from __future__ import annotations

import hashlib
import time
from datetime import datetime, timezone
from typing import Any

from fedzoo.cards import ModelCard
from fedzoo.clients.client import FedzooClient
from fedzoo.clients.metered import MeteredBytes

RUNNING = ("open", "collecting", "aggregating")  # a round's states before it has closed or failed


class OperatorClient(FedzooClient):
    """A client that can also act as the operator: every admin call takes the admin token it sends."""

    def __enter__(self) -> OperatorClient:  # typed as this class in `with OperatorClient(...) as operator`
        return self

    def create_rounds(self, config: dict[str, Any], admin_token: str) -> dict[str, Any]:
        """Start a plan of rounds (POST /v1/fl/rounds)."""
        return self.http.request("POST", "/v1/fl/rounds", json=config, expected=(201,),
                                 headers=_bearer(admin_token)).json()

    def create_zoo_rounds(self, config: dict[str, Any], admin_token: str) -> dict[str, Any]:
        """Start a zoo-wide plan on the zoo's supernet card (POST /v1/fl/zoo-rounds)."""
        return self.http.request("POST", "/v1/fl/zoo-rounds", json=config, expected=(201,),
                                 headers=_bearer(admin_token)).json()

    def wait_for_round(self, round_id: int, timeout_s: float | None = None) -> dict[str, Any]:
        """The round's view (GET /v1/fl/rounds/<id>) once it has closed or failed; still running after `timeout_s`,
        as it is then (the caller's check of its `state` says so). Short polls: at fleet scale a round's own work is
        seconds and every poll's wait adds to it; a running round is read again no later than just past its
        deadline, when the server ends it."""
        give_up = None if timeout_s is None else time.monotonic() + timeout_s
        view = self.fl_round(round_id)
        while view["state"] in RUNNING and (give_up is None or time.monotonic() < give_up):
            until_deadline_s = _seconds_until(view["deadline_at"])
            time.sleep(0.05 if view["state"] == "aggregating" else min(0.25, until_deadline_s + 0.05))
            view = self.fl_round(round_id)
        return view

    def create_enrollment_token(self, admin_token: str, max_uses: int = 1, expires_in_s: int | None = None,
                                label: str | None = None, device_class: str | None = None) -> dict[str, Any]:
        """A new enrollment token (POST /v1/enrollment-tokens); its `token` is in this answer only."""
        body = {key: value for key, value in {"max_uses": max_uses, "expires_in_s": expires_in_s, "label": label,
                                              "device_class": device_class}.items() if value is not None}
        return self.http.request("POST", "/v1/enrollment-tokens", json=body, expected=(201,),
                                 headers=_bearer(admin_token)).json()

    def publish_blob(self, data: bytes, admin_token: str) -> str:
        """Upload one blob (PUT /v1/blobs/<sha256>); returns its sha256. `progress` hears its bytes go."""
        sha256 = hashlib.sha256(data).hexdigest()
        body = data if self.progress is None else MeteredBytes(data, f"upload {sha256[:12]}", self.progress)
        self.http.request("PUT", f"/v1/blobs/{sha256}", content=body, expected=(200, 201),
                          headers={**_bearer(admin_token), "Content-Type": "application/octet-stream",
                                   "Content-Length": str(len(data))})
        return sha256

    def publish_model(self, card: ModelCard, blobs: dict[str, bytes], admin_token: str) -> dict[str, Any]:
        """Upload a card's blobs, then publish the card (POST /v1/models wants the card's blobs uploaded)."""
        for data in blobs.values():
            self.publish_blob(data, admin_token)
        return self.http.request("POST", "/v1/models", content=card.to_json(), expected=(200, 201),
                                 headers={**_bearer(admin_token), "Content-Type": "application/json"}).json()


def _bearer(admin_token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {admin_token}"}


def _seconds_until(moment: str) -> float:
    return max(0.0, (datetime.fromisoformat(moment) - datetime.now(timezone.utc)).total_seconds())
