"""The fedzoo device SDK: register, look up the best model, download it, run it, report its latency,
and the federated-learning calls. numpy + onnxruntime + httpx only; never torch.

    client = FedzooClient("http://127.0.0.1:8000", cache_dir="~/.cache/fedzoo")
    client.register(collect_device_profile("phone-17"))       # keeps the token it is given
    choice = client.lookup("mnist", latency_budget_ms=5.0)
    path = client.download_model(choice["model"])             # resumable, sha256-checked, cached
    logits = client.session(choice["model"]).run(images)      # onnxruntime, card's normalisation
    client.report_latency(choice["model"]["id"], median_ms=1.2)
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from fedzoo.cards import ModelCard
from fedzoo.clients.download import BlobCache, download_blob
from fedzoo.clients.http import FedzooHTTP, RetryPolicy
from fedzoo.device import DeviceProfile


class FedzooClient:
    """One device's session with one server."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        cache_dir: str | Path | None = None,
        retry: RetryPolicy | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self.http = FedzooHTTP(base_url, token=token, retry=retry, timeout_s=timeout_s)
        self.cache = BlobCache(Path(cache_dir).expanduser() if cache_dir is not None else None)
        self.downloaded_bytes = 0
        self.uploaded_bytes = 0

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> FedzooClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @property
    def token(self) -> str | None:
        return self.http.token

    # registry --------------------------------------------------------------------------------------

    def register(self, profile: DeviceProfile) -> dict[str, Any]:
        """Register this device; the token in the answer is kept for every later call."""
        registration = self.http.post_json("/v1/devices", json.loads(profile.model_dump_json()), expected=(201,))
        self.http.token = registration["token"]
        return registration

    def list_models(self, task: str | None = None, limit: int = 50, offset: int = 0) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        if task is not None:
            params["task"] = task
        return self.http.get_json("/v1/models", params=params)

    def card(self, model_id: str) -> ModelCard:
        return ModelCard.from_dict(self.http.get_json(f"/v1/models/{model_id}"))

    def lookup(
        self, task: str, latency_budget_ms: float, memory_budget_mb: float | None = None,
        min_accuracy: float | None = None,
    ) -> dict[str, Any]:
        """The server's choice for this device: `model` (the card), `latency_ms`, `reason`, `runner_up`."""
        body: dict[str, Any] = {"task": task, "latency_budget_ms": latency_budget_ms}
        if memory_budget_mb is not None:
            body["memory_budget_mb"] = memory_budget_mb
        if min_accuracy is not None:
            body["min_accuracy"] = min_accuracy
        return self.http.post_json("/v1/lookup", body, expected=(200,))

    # blobs -----------------------------------------------------------------------------------------

    def download_model(self, card: ModelCard | dict[str, Any]) -> Path:
        """The model's ONNX file in the cache (downloaded, resumed or reused)."""
        card = card if isinstance(card, ModelCard) else ModelCard.from_dict(card)
        return self.download(f"/v1/models/{card.id}/blob", card.sha256)

    def download_blob(self, sha256: str) -> Path:
        """Any blob (a training graph, an artifact) by digest, through the cache."""
        return self.download(f"/v1/blobs/{sha256}", sha256)

    def download(self, url_path: str, sha256: str) -> Path:
        """The blob at `url_path` (expected to hash to `sha256`) through the cache."""
        path, transferred = download_blob(self.http, url_path, sha256, self.cache)
        self.downloaded_bytes += transferred
        return path

    # inference and telemetry -----------------------------------------------------------------------

    def session(self, card: ModelCard | dict[str, Any], threads: int = 1):
        """An `EdgeSession` of the model (downloaded if needed), applying the card's normalisation."""
        from fedzoo.edge.runtime import EdgeSession

        card = card if isinstance(card, ModelCard) else ModelCard.from_dict(card)
        return EdgeSession(self.download_model(card), card, threads=threads)

    def report_latency(
        self, model_id: str, median_ms: float, p90_ms: float | None = None, threads: int | None = None
    ) -> dict[str, Any]:
        """Tell the server how fast the model ran here, so later lookups use this device's own figure."""
        body: dict[str, Any] = {"model_id": model_id, "median_ms": median_ms}
        if p90_ms is not None:
            body["p90_ms"] = p90_ms
        if threads is not None:
            body["threads"] = threads
        return self.http.post_json("/v1/telemetry", body, expected=(201,))

    # federated learning ----------------------------------------------------------------------------

    def fl_task(self, task: str, family: str | None = None) -> dict[str, Any]:
        """Check in: `{"task": {...} | None, "retry_after_s": ...}`."""
        params = {"task": task} if family is None else {"task": task, "family": family}
        return self.http.get_json("/v1/fl/task", params=params)

    def fl_round(self, round_id: int) -> dict[str, Any]:
        return self.http.get_json(f"/v1/fl/rounds/{round_id}")

    def upload_update(self, upload_url: str, metadata: dict[str, Any], delta_npz: bytes) -> dict[str, Any]:
        """Send one update (multipart: metadata JSON + delta .npz); returns the server's receipt."""
        response = self.http.request(
            "POST", upload_url, expected=(201,),
            files={"delta": ("delta.npz", delta_npz, "application/octet-stream")},
            data={"metadata": json.dumps(metadata)},
        )
        self.uploaded_bytes += len(delta_npz)
        return response.json()

    def secure_reply(self, reply_url: str, reply: dict[str, Any] | bytes) -> dict[str, Any]:
        """Send this device's reply to a SecAgg+ stage: JSON, or the masked vector's raw bytes."""
        if isinstance(reply, bytes):
            response = self.http.request("POST", reply_url, expected=(201,), content=reply,
                                         headers={"Content-Type": "application/octet-stream"})
            self.uploaded_bytes += len(reply)
        else:
            body = json.dumps(reply).encode()
            response = self.http.request("POST", reply_url, expected=(201,), content=body,
                                         headers={"Content-Type": "application/json"})
            self.uploaded_bytes += len(body)
        return response.json()

    def create_rounds(self, config: dict[str, Any], admin_token: str) -> dict[str, Any]:
        """Admin: start a plan of rounds (POST /v1/fl/rounds)."""
        return self.http.request(
            "POST", "/v1/fl/rounds", json=config, expected=(201,), headers={"Authorization": f"Bearer {admin_token}"}
        ).json()

    def publish_blob(self, data: bytes, admin_token: str) -> str:
        """Admin: upload one blob (PUT /v1/blobs/<sha256>); returns its sha256."""
        sha256 = hashlib.sha256(data).hexdigest()
        self.http.request("PUT", f"/v1/blobs/{sha256}", content=data, expected=(200, 201),
                          headers={"Authorization": f"Bearer {admin_token}", "Content-Type": "application/octet-stream"})
        return sha256

    def publish_model(self, card: ModelCard, blobs: dict[str, bytes], admin_token: str) -> dict[str, Any]:
        """Admin: upload a card's blobs and publish the card (POST /v1/models)."""
        for data in blobs.values():
            self.publish_blob(data, admin_token)
        return self.http.request("POST", "/v1/models", content=card.to_json(), expected=(200, 201),
                                 headers={"Authorization": f"Bearer {admin_token}",
                                          "Content-Type": "application/json"}).json()
