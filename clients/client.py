"""The fedzoo device SDK: register, look up the best model, download it, run it, report its latency,
and the federated-learning calls. numpy + onnxruntime + httpx only; never torch.

    client = FedzooClient("http://127.0.0.1:8000", cache_dir="~/.cache/fedzoo",
                          state_file="~/.config/fedzoo/client.json")  # device id, token, its expiry
    client.register(collect_device_profile("phone-17"), enrollment_token)  # keeps the token it is given
    choice = client.lookup("mnist", latency_budget_ms=5.0)
    path = client.download_model(choice["model"])             # resumable, sha256-checked, cached
    # FedzooClient(..., trusted_keys=TrustedKeys.load("fleet-keys.json"), state_file=...): cards signed by a pinned key
    logits = client.session(choice["model"]).run(images)      # onnxruntime, card's normalisation
    client.report_latency(choice["model"]["id"], median_ms=1.2)
    confirmed = client.lookup_confirmed("mnist", latency_budget_ms=5.0)  # the shortlist timed here

Registering also makes the device's long-term Ed25519 signing key (kept in the state file, its public half
sent to the server): SecAgg+ rounds need it (`fedzoo.clients.secure_participation`, docs/privacy.md).

The device token expires (the server says when); every device call first trades it for a fresh one once
less than `REFRESH_AT_LIFETIME_FRACTION` of its lifetime is left, keeping the expiry in the state file so a
restarted app does the same. A token the server refuses as expired or revoked raises
`ReregistrationRequiredError`: the device needs an enrollment token again.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedzoo.capabilities import PYTHON_SDK, Capabilities
from fedzoo.cards import ModelCard
from fedzoo.clients import held_privacy_terms, held_revocations
from fedzoo.clients.card_trust import CardVerifier
from fedzoo.clients.confirmation import ConfirmationPolicy, confirmed_lookup
from fedzoo.clients.device_state import StateFileSignedRounds, load_state, update_state
from fedzoo.clients.download import BlobCache, download_blob, sha256_of_file
from fedzoo.clients.errors import IntegrityError, NotFoundAPIError
from fedzoo.clients.http import FedzooHTTP, RetryPolicy
from fedzoo.clients.neighbour_trust import NeighbourTrust
from fedzoo.clients.metered import MeteredFile, ProgressCallback
from fedzoo.device import DeviceProfile
from fedzoo.dp.distributed import NoisePolicy, policy_for
from fedzoo.privacy_terms import PrivacyTerms
from fedzoo.errors import InvalidInputError
from fedzoo.revocation import RevocationList
from fedzoo.secagg import signatures
from fedzoo.secagg.signed_rounds import SignedRounds
from fedzoo.signing import TrustedKeys

# Rotate the device token once less than this share of its lifetime is left (the Java SDK does the same).
REFRESH_AT_LIFETIME_FRACTION = 0.5
SIGNING_KEY_STATE = "secagg_signing_key"  # the state file's key for the raw Ed25519 private key (base64)


class FedzooClient:
    """One device's session with one server."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        cache_dir: str | Path | None = None,
        retry: RetryPolicy | None = None,
        timeout_s: float = 30.0,
        state_file: str | Path | None = None,
        trusted_keys: TrustedKeys | None = None,
        progress: ProgressCallback | None = None,
        clock: Callable[[], float] = time.time,
        signing_key: Ed25519PrivateKey | None = None,
        transport: httpx.BaseTransport | None = None,
        operator_keys: TrustedKeys | None = None,
        noise_policy: NoisePolicy = NoisePolicy(),
    ) -> None:
        """`state_file` keeps the device id, token and token expiry across restarts (a token saved there is
        used when `token` is not given). `trusted_keys` pins the fleet's card-signing keys: every card must then
        verify before its model is downloaded or loaded, and the newest version accepted per model line is kept
        in the state file, which pinning therefore needs (in a durable directory, not the cache: clearing a
        cache must not reset it), so that no later card can roll a line back.
        `progress`, when given, hears every download and upload's bytes as they move (for progress bars).
        `clock` gives this device's Unix time, which decides when the token is due for rotation.
        `signing_key` is the device's long-term SecAgg+ key where it is not kept in the state file.
        `transport` replaces the network: e.g. `httpx.WSGITransport` into a server app in this process (a
        simulation's virtual devices, `fedzoo.server.testing.InProcessServer`).
        `operator_keys` pins the operator's key set (`fedzoo keys export-public`; never `GET /v1/keys`, which holds
        the server's key): SecAgg+ neighbours count only with the operator's certificate, and without it this
        device declines SecAgg+ rounds (`operator_keys_required`); they also verify the operator's revocation list.
        It needs the state_file too (the newest revocation list is kept there). With them the device also follows
        the operator's signed privacy terms (`refresh_privacy_terms`, before every task). `noise_policy` is the
        owner's own terms for DP under SecAgg+ (require that it adds its own share of the noise; a floor on the
        noise multiplier: `fedzoo.dp.distributed.NoisePolicy`), on top of the operator's."""
        self.http = FedzooHTTP(base_url, token=token, retry=retry, timeout_s=timeout_s, transport=transport)
        self.progress = progress
        self.clock = clock
        self.cache = BlobCache(Path(cache_dir).expanduser() if cache_dir is not None else None)
        self.downloaded_bytes = 0
        self.uploaded_bytes = 0
        self.state_file = Path(state_file).expanduser() if state_file is not None else None
        if trusted_keys is not None and self.state_file is None:
            raise InvalidInputError("pinned keys need a state_file (in a durable state directory, not the cache): "
                                    "the versions accepted per model line must survive restarts and cache clears",
                                    field="state_file")
        if operator_keys is not None and self.state_file is None:
            raise InvalidInputError("the operator key set needs a state_file (in a durable state directory): the "
                                    "newest revocation list must survive restarts", field="state_file")
        self.card_verifier = None if trusted_keys is None else CardVerifier(trusted_keys, self.state_file)
        self.neighbour_trust = None if operator_keys is None else NeighbourTrust(operator_keys, self.state_file)
        self.device_id: str | None = None
        self.token_refresh_at_s: float | None = None  # Unix time on this device's clock
        saved = load_state(self.state_file) if self.state_file is not None else {}
        if token is None and saved.get("token"):
            self.device_id = saved.get("device_id")
            self.http.token = saved["token"]
            self.token_refresh_at_s = saved.get("token_refresh_at_s")
        self.signing_key = signing_key
        self.noise_policy = noise_policy
        # the SecAgg+ round ids this device took part in: it never signs under one twice (docs/privacy.md)
        self.signed_rounds = StateFileSignedRounds(self.state_file) if self.state_file is not None else SignedRounds()
        if signing_key is None and saved.get(SIGNING_KEY_STATE):
            self.signing_key = signatures.load_signing_key(base64.b64decode(saved[SIGNING_KEY_STATE]))

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

    def register(self, profile: DeviceProfile, enrollment_token: str | None = None) -> dict[str, Any]:
        """Register this device with the fleet's enrollment token (None only where the server enrolls openly);
        the device token in the answer is kept for every later call (and in the state file). Not re-sent
        after an ambiguous failure: a second registration would be refused as a duplicate."""
        device_token, self.http.token = self.http.token, None  # an old device token is no enrollment credential
        headers = {"Authorization": f"Bearer {enrollment_token}"} if enrollment_token is not None else None
        signing_key = signatures.new_signing_key()  # a new identity, a new key
        body = {**json.loads(profile.model_dump_json()),
                "signing_public_key": base64.b64encode(signatures.public_bytes(signing_key)).decode("ascii")}
        try:
            registration = self.http.request("POST", "/v1/devices", json=body, headers=headers,
                                             expected=(201,)).json()
        finally:
            self.http.token = device_token
        self.signing_key = signing_key
        if self.state_file is not None:
            update_state(self.state_file, {SIGNING_KEY_STATE: base64.b64encode(
                signatures.private_bytes(signing_key)).decode("ascii")})
        self.device_id = registration["device_id"]
        self._keep_token(registration["token"], registration.get("token_expires_in_s"))
        return registration

    def refresh_token(self) -> dict[str, Any]:
        """Trade the device token for a fresh one (POST /v1/devices/<id>/token); the server keeps the old one
        working for a short grace, so requests already sent with it still succeed."""
        if self.device_id is None:
            raise InvalidInputError("register first (or give a state_file): refreshing a token needs the device id",
                                    field="device_id")
        answer = self.http.request("POST", f"/v1/devices/{self.device_id}/token", expected=(201,)).json()
        self._keep_token(answer["token"], answer.get("token_expires_in_s"))
        return answer

    def _keep_token(self, token: str, lifetime_s: float | None) -> None:
        now = self.clock()
        self.http.token = token
        self.token_refresh_at_s = now + lifetime_s * REFRESH_AT_LIFETIME_FRACTION if lifetime_s is not None else None
        if self.state_file is not None:
            update_state(self.state_file, {
                "server": self.http.base_url, "device_id": self.device_id, "token": token,
                "token_expires_at_s": now + lifetime_s if lifetime_s is not None else None,
                "token_refresh_at_s": self.token_refresh_at_s,
            })

    def _refresh_token_if_due(self) -> None:
        due_at_s = self.token_refresh_at_s
        if due_at_s is not None and self.device_id is not None and self.clock() >= due_at_s:
            self.refresh_token()

    def list_models(self, task: str | None = None, limit: int = 50, offset: int = 0) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        if task is not None:
            params["task"] = task
        return self.http.get_json("/v1/models", params=params)

    def card(self, model_id: str) -> ModelCard:
        """The card of `model_id`; `IntegrityError` when the server answers another model's card."""
        return ModelCard.from_dict(self.card_json(model_id))

    def card_json(self, model_id: str) -> dict[str, Any]:
        """The card of `model_id` as JSON, refused (`IntegrityError`) unless its id is the one asked for: a
        signed card of another model verifies, so only this check stops it passing for the one asked for."""
        document = self.http.get_json(f"/v1/models/{model_id}")
        answered = document.get("id") if isinstance(document, dict) else None
        if answered != model_id:
            raise IntegrityError(f"asked for the card of {model_id!r}, the server answered the card of {answered!r}")
        return document

    def lookup(
        self, task: str, latency_budget_ms: float, memory_budget_mb: float | None = None,
        min_accuracy: float | None = None, precision: str | None = None, latency_margin_sigmas: float | None = None,
        shortlist_max_models: int | None = None,
    ) -> dict[str, Any]:
        """The server's choice for this device: `model` (the card), `latency_ms` and its `latency_log_sigma`,
        `reason`, `runner_up`, and with `shortlist_max_models` the `shortlist` to time on the device."""
        self._refresh_token_if_due()
        body: dict[str, Any] = {"task": task, "latency_budget_ms": latency_budget_ms}
        options = {"memory_budget_mb": memory_budget_mb, "min_accuracy": min_accuracy, "precision": precision,
                   "latency_margin_sigmas": latency_margin_sigmas, "shortlist_max_models": shortlist_max_models}
        body.update({name: value for name, value in options.items() if value is not None})
        return self.http.post_json("/v1/lookup", body, expected=(200,))

    def lookup_confirmed(
        self, task: str, latency_budget_ms: float, memory_budget_mb: float | None = None,
        min_accuracy: float | None = None, precision: str | None = None, latency_margin_sigmas: float | None = None,
        policy: ConfirmationPolicy | None = None,
    ) -> dict[str, Any]:
        """The lookup, confirmed on this device: the server's shortlist timed here, the most accurate model
        that measured within the budget kept, every timing reported (`fedzoo.clients.confirmation`). The answer
        has `model`, `latency_ms`, `confirmed`, `measurements`, `skipped`, `seconds_spent`, `bytes_downloaded`."""
        query = {"task": task, "latency_budget_ms": latency_budget_ms, "memory_budget_mb": memory_budget_mb,
                 "min_accuracy": min_accuracy, "precision": precision, "latency_margin_sigmas": latency_margin_sigmas}
        return confirmed_lookup(self, query, policy or ConfirmationPolicy())

    def calibration_models(self) -> dict[str, bytes]:
        """The server's calibration models by name (downloaded through the cache), to time for registration
        on a device without `onnx`: `collect_device_profile(..., calibration_models=client.calibration_models())`."""
        models: dict[str, bytes] = {}
        offset: int | None = 0
        while offset is not None:
            page = self.http.get_json("/v1/calibration-models", params={"limit": 200, "offset": offset})
            for entry in page["calibration_models"]:
                models[entry["name"]] = self.download_blob(entry["sha256"]).read_bytes()
            offset = page["next_offset"]
        return models

    # blobs -----------------------------------------------------------------------------------------

    @property
    def signed_cards_required(self) -> bool:
        return self.card_verifier is not None

    def refresh_revocations(self) -> RevocationList | None:
        """Fetch the operator's signed revocation list (`GET /v1/revocations`) and keep it when it is newer than
        the one this device holds; from then on `download_model` / `session` refuse the cards it revokes and
        SecAgg+ rounds the device keys it revokes. It is verified against the operator keys (`operator_keys`),
        or the pinned card keys where no operator keys are pinned. A list none of them signed, an older one (a
        server rolling a revocation back) or a different one under the held version raises `CardSignatureError`.
        None when neither this device nor the server holds a list."""
        keys = (self.neighbour_trust.operator_keys if self.neighbour_trust is not None
                else self.card_verifier.trusted_keys if self.card_verifier is not None else None)
        if keys is None:
            raise InvalidInputError("a revocation list is verified against the pinned keys: give operator_keys or "
                                    "trusted_keys", field="operator_keys")
        document = self.served_revocation_list()
        if document is None:
            return held_revocations.held(self.state_file)  # none published: keep whatever this device holds
        return held_revocations.hold(self.state_file, document, keys)

    def served_revocation_list(self) -> dict[str, Any] | None:
        """The operator's newest signed revocation list as the server serves it, not yet verified (None: the
        server has none)."""
        try:
            return self.http.get_json("/v1/revocations")
        except NotFoundAPIError:
            return None

    def refresh_privacy_terms(self) -> PrivacyTerms | None:
        """Fetch the operator's signed privacy terms (`GET /v1/privacy-terms`) and keep them when newer than the
        ones this device holds (`hold_privacy_terms`); None when neither this device nor the server holds any."""
        try:
            document = self.http.get_json("/v1/privacy-terms")
        except NotFoundAPIError:
            return held_privacy_terms.held(self._operator_trust().state_path)  # none published: keep what is held
        return self.hold_privacy_terms(document)

    def hold_privacy_terms(self, document: dict[str, Any]) -> PrivacyTerms:
        """Verify terms against the operator keys and keep them when newer than the held ones (an app may ship
        the terms it was built with, so that a server cannot withhold them from a fresh install);
        `CardSignatureError` for terms no operator key signed, older ones or different ones under the held
        version."""
        trust = self._operator_trust()
        return held_privacy_terms.hold(trust.state_path, document, trust.operator_keys)

    def noise_policy_for(self, line_id: str) -> NoisePolicy:
        """This device's `NoisePolicy` for a round on `line_id`: the owner's `noise_policy`, made at least as
        strict as the operator's privacy terms this device holds for the line (`fedzoo.privacy_terms`)."""
        terms = held_privacy_terms.held(self.state_file) if self.neighbour_trust is not None else None
        return policy_for(terms, line_id, self.noise_policy)

    def _operator_trust(self) -> NeighbourTrust:
        if self.neighbour_trust is None:
            raise InvalidInputError("privacy terms are verified against the operator keys: give operator_keys",
                                    field="operator_keys")
        return self.neighbour_trust

    def download_model(self, card: ModelCard | dict[str, Any]) -> Path:
        """The model's ONNX file in the cache (downloaded, resumed or reused); with pinned keys, only after
        the card verified, and the file's sha256 is checked again even when it was cached."""
        card = card if isinstance(card, ModelCard) else ModelCard.from_dict(card)
        return self._verified_blob(card, f"/v1/models/{card.id}/blob", card.sha256)

    def download_training_graph(self, card: ModelCard) -> Path:
        """The card's on-device training graph, under the same checks as `download_model`."""
        if card.training_graph is None:
            raise IntegrityError(f"model {card.id!r} has no training graph")
        return self._verified_blob(card, f"/v1/blobs/{card.training_graph}", card.training_graph)

    def _verified_blob(self, card: ModelCard, url_path: str, sha256: str) -> Path:
        if self.card_verifier is None:
            return self.download(url_path, sha256)
        self.card_verifier.verify(card)  # before a byte is fetched: an untrusted card costs no download
        path = self.download(url_path, sha256)
        actual = sha256_of_file(path)  # a cached file could have been altered on disk since it was stored
        if actual != sha256:
            path.unlink(missing_ok=True)
            raise IntegrityError(f"cached blob {path} hashes to {actual}, not {sha256} as card {card.id!r} "
                                 "signs; discarded")
        self.card_verifier.accept(card)
        return path

    def download_blob(self, sha256: str) -> Path:
        """Any blob (a training graph, an artifact) by digest, through the cache."""
        return self.download(f"/v1/blobs/{sha256}", sha256)

    def download(self, url_path: str, sha256: str) -> Path:
        """The blob at `url_path` (expected to hash to `sha256`) through the cache."""
        self._refresh_token_if_due()
        path, transferred = download_blob(self.http, url_path, sha256, self.cache, progress=self.progress)
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
        self._refresh_token_if_due()
        body: dict[str, Any] = {"model_id": model_id, "median_ms": median_ms}
        if p90_ms is not None:
            body["p90_ms"] = p90_ms
        if threads is not None:
            body["threads"] = threads
        return self.http.post_json("/v1/telemetry", body, expected=(201,))

    # federated learning ----------------------------------------------------------------------------

    def fl_task(self, task: str, family: str | None = None, capabilities: Capabilities = PYTHON_SDK) -> dict[str, Any]:
        """Check in, declaring what this device can do: `{"task": {...} | None, "retry_after_s": ...}`."""
        self._refresh_token_if_due()
        params = {"task": task, **({} if family is None else {"family": family}), **capabilities.to_query()}
        return self.http.get_json("/v1/fl/task", params=params)

    def decline_task(self, round_id: int, reason: str, message: str = "") -> dict[str, Any]:
        """Tell the server this device will not do round `round_id`'s task, and why (the round records it)."""
        self._refresh_token_if_due()
        return self.http.post_json(f"/v1/fl/rounds/{round_id}/decline", {"reason": reason, "message": message[:500]},
                                   expected=(201,))

    def fl_round(self, round_id: int) -> dict[str, Any]:
        """A round's state and outcome (`GET /v1/fl/rounds/<id>`): needs the viewer or admin token."""
        self._refresh_token_if_due()
        return self.http.get_json(f"/v1/fl/rounds/{round_id}")

    def upload_update(self, upload_url: str, metadata: dict[str, Any], delta_npz: bytes) -> dict[str, Any]:
        """Send one update (multipart: metadata JSON + delta .npz); returns the server's receipt."""
        self._refresh_token_if_due()
        delta = delta_npz if self.progress is None else MeteredFile(delta_npz, "upload update", self.progress)
        response = self.http.request(
            "POST", upload_url, expected=(201,),
            files={"delta": ("delta.npz", delta, "application/octet-stream")},
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
