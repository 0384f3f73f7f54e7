"""Request and response bodies of the REST API (pydantic). The OpenAPI document is generated from
these, so what is validated and what is documented are the same thing.

Request models are strict: a string where a number belongs is an error, not a coercion, and unknown
fields are refused, so a misspelt `latency_budget_ms` cannot silently mean "no budget".
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from fedzoo.cards import IDENTIFIER_PATTERN, SHA256_PATTERN, ModelCard
from fedzoo.device import DeviceProfile

Precision = Literal["fp32", "int8"]


class StrictRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Response(BaseModel):
    model_config = ConfigDict(extra="forbid")


# errors ------------------------------------------------------------------------------------------

class ErrorDetail(Response):
    code: str = Field(description="stable machine-readable code, e.g. invalid_field, no_model_fits")
    message: str = Field(description="what was wrong, with the offending value")
    field: str | None = Field(description="the request field at fault (dotted path), or null")
    closest: CandidateSummary | None = Field(default=None, description="no_model_fits only: the nearest miss")
    retry_after_s: int | None = Field(default=None, description="rate_limited only: seconds until the limit's "
                                                                "window resets (as the Retry-After header)")


class ErrorResponse(Response):
    error: ErrorDetail


class PageQuery(StrictRequest):
    """`limit` and `offset` of every list endpoint."""

    model_config = ConfigDict(extra="forbid", strict=False)  # query strings are text: "50" means 50

    limit: int = Field(default=50, ge=1, le=200)
    offset: int = Field(default=0, ge=0, le=10_000_000)


# bounded versions of the shared contracts ---------------------------------------------------------
# Numbers the registry stores in 64-bit columns get upper bounds, so no request can overflow them.
MAX_STORED_INTEGER = 2**62


class DeviceProfileRequest(DeviceProfile):
    """`fedzoo.device.DeviceProfile` as POST /v1/devices takes it, with the device's long-term signing key."""

    memory_mb: int = Field(ge=1, le=1_048_576 * 1024, description="device memory (MiB)")
    signing_public_key: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9+/]{42}[AEIMQUYcgkosw048]=$",
        description="base64 of the device's raw 32-byte Ed25519 public key; needed to take part in SecAgg+ rounds "
                    "(docs/privacy.md), fixed for the device's lifetime")


class ModelCardRequest(ModelCard):
    """`fedzoo.cards.ModelCard` as POST /v1/models takes it.

    Rules across fields (422 naming the field): every dimension of `input.shape` is a positive integer
    or a symbolic name (e.g. "batch"); `sha256` and every blob the card names must already be uploaded,
    and `size_bytes` must be the size of the `sha256` blob; `normalisation.mean` and `std` have one
    entry per channel and positive `std`."""

    version: int = Field(default=1, ge=1, le=2**31 - 1)
    macs: int = Field(ge=0, le=MAX_STORED_INTEGER)
    params: int = Field(ge=0, le=MAX_STORED_INTEGER)
    size_bytes: int = Field(ge=1, le=MAX_STORED_INTEGER)


# devices -----------------------------------------------------------------------------------------

class DeviceRegistration(Response):
    device_id: str
    token: str = Field(description="send as 'Authorization: Bearer <token>'; shown only once")
    token_expires_in_s: int = Field(description="the token stops working after this many seconds; rotate it "
                                                "before (POST /v1/devices/{device_id}/token)")
    latency_scales: dict[str, float] = Field(
        description="per latency-predictor cost group, device time / reference time (from its calibration benchmarks)"
    )
    latency_scales_basis: str


class TokenRotation(Response):
    token: str = Field(description="the device's new token, shown only once; the previous one keeps working "
                                   "for a short grace period (docs/operations-security.md), then stops")
    token_expires_in_s: int


class DeviceRevocation(Response):
    device_id: str
    revoked_at: datetime


# enrollment tokens (admin) -----------------------------------------------------------------------

class EnrollmentTokenRequest(StrictRequest):
    expires_in_s: int = Field(default=7 * 24 * 3600, ge=60, le=366 * 24 * 3600,
                              description="the token enrolls no device after this many seconds")
    max_uses: int = Field(default=1, ge=1, le=1_000_000, description="how many devices it may enroll")
    label: str | None = Field(default=None, max_length=200, description="for operators, e.g. 'lab bench 3'")
    device_class: str | None = Field(default=None, pattern=IDENTIFIER_PATTERN,
                                     description="when set, only devices registering with this device_class")


class EnrollmentTokenView(Response):
    """An enrollment token as listed: never the token itself, never its hash."""

    id: str
    label: str | None
    device_class: str | None
    max_uses: int
    uses: int
    created_at: datetime
    expires_at: datetime
    revoked_at: datetime | None
    state: Literal["active", "expired", "used_up", "revoked"]


class IssuedEnrollmentToken(EnrollmentTokenView):
    token: str = Field(description="give this to the devices' installer; shown only now, never again")


class EnrollmentTokenListQuery(PageQuery):
    pass


class EnrollmentTokenList(Response):
    enrollment_tokens: list[EnrollmentTokenView]
    total: int
    limit: int
    offset: int
    next_offset: int | None = Field(description="offset of the next page, or null on the last page")


# models ------------------------------------------------------------------------------------------

class ModelListQuery(PageQuery):
    task: str | None = Field(default=None, pattern=IDENTIFIER_PATTERN)
    precision: Precision | None = None


class ModelList(Response):
    models: list[ModelCard]
    total: int
    limit: int
    offset: int
    next_offset: int | None = Field(description="offset of the next page, or null on the last page")


class PublishResponse(Response):
    card: ModelCard
    created: bool = Field(description="false when this exact card was already published")


class PublicKey(Response):
    key_id: str = Field(pattern=r"^[0-9a-f]{16}$", description="16 hex digits of the sha256 of the raw key")
    algorithm: Literal["ed25519"]
    public_key: str = Field(description="base64 of the 32-byte raw ed25519 public key")


class KeySet(Response):
    """The keys whose card signatures the fleet accepts: what `CardVerifier.fromJson` and `--trusted-keys` read."""

    keys: list[PublicKey]


class SignedRevocationList(StrictRequest):
    """The operator's signed revocation list (`fedzoo.revocation`): the signed bytes travel in `payload`."""

    key_id: str = Field(pattern=r"^[0-9a-f]{16}$", description="the operator key that signed it")
    algorithm: Literal["ed25519"] = "ed25519"
    payload: str = Field(min_length=1, max_length=16 * 1024 * 1024, description=(
        'base64 of the signed JSON {"purpose": "revocation_list", "contract": 1, "version", "issued_at", "key_id", '
        '"revoked_cards": {"ids", "sha256s"}, "revoked_device_keys": [hex sha256 of each revoked device signing '
        'key]}'))
    signature: str = Field(min_length=1, max_length=200, description="base64 of the 64-byte ed25519 signature over "
                           "'fedzoo-revocation-list-v1\\n' + payload")


class RevocationListView(Response):
    """The newest revocation list the server holds, as signed; devices verify it against their pinned operator keys."""

    key_id: str
    algorithm: Literal["ed25519"]
    payload: str
    signature: str


class RevocationListStored(Response):
    version: int
    revoked_card_ids: int
    revoked_card_sha256s: int
    revoked_device_keys: int


class SignedPrivacyTerms(StrictRequest):
    """The operator's signed privacy terms (`fedzoo.privacy_terms`): the signed bytes travel in `payload`."""

    key_id: str = Field(pattern=r"^[0-9a-f]{16}$", description="the operator key that signed them")
    algorithm: Literal["ed25519"] = "ed25519"
    payload: str = Field(min_length=1, max_length=4 * 1024 * 1024, description=(
        'base64 of the signed JSON {"purpose": "privacy_terms", "contract": 1, "version", "issued_at", "key_id", '
        '"lines": {"<line id>" or "*": {"mode": "distributed", "minimum_noise_multiplier"}}}'))
    signature: str = Field(min_length=1, max_length=200, description="base64 of the 64-byte ed25519 signature over "
                           "'fedzoo-privacy-terms-v1\\n' + payload")


class SignedPrivacyTermsView(RevocationListView):
    """The newest privacy terms the server holds, as signed; devices verify them against their pinned operator
    keys."""


class PrivacyTermsStored(Response):
    version: int
    lines: list[str] = Field(description="the lines the terms cover ('*': every line they do not name)")


class BlobUploadResponse(Response):
    sha256: str = Field(pattern=SHA256_PATTERN)
    size_bytes: int
    created: bool = Field(description="false when the blob was already stored")


# lookup ------------------------------------------------------------------------------------------

class LookupRequest(StrictRequest):
    task: str = Field(pattern=IDENTIFIER_PATTERN)
    latency_budget_ms: float = Field(gt=0.0, le=3_600_000.0)
    memory_budget_mb: float | None = Field(default=None, gt=0.0, le=1_048_576.0,
                                           description="defaults to the device's memory_mb")
    min_accuracy: float | None = Field(default=None, ge=0.0, le=1.0)
    precision: Precision | None = None
    latency_margin_sigmas: float = Field(
        default=0.0, ge=0.0, le=5.0,
        description="a model fits when latency_ms x exp(k x latency_log_sigma) <= latency_budget_ms (k = this)")
    shortlist_max_models: int | None = Field(
        default=None, ge=1, le=16,
        description="also return up to this many models for the device to time: those ranked above the choice "
                    "that might truly fit, then the choice")


class CandidateSummary(Response):
    model_id: str
    accuracy: float
    latency_ms: float
    latency_source: Literal["measured", "predicted"]
    latency_basis: Literal["device_telemetry", "card_device_class", "predictor"]
    latency_log_sigma: float = Field(description="one-sigma uncertainty of latency_ms in log space")
    memory_mb: float


class ShortlistEntry(CandidateSummary):
    sha256: str = Field(pattern=SHA256_PATTERN, description="the model's blob (GET /v1/models/{id}/blob)")
    size_bytes: int


class LookupResponse(Response):
    model: ModelCard
    latency_ms: float
    latency_source: Literal["measured", "predicted"] = Field(
        description="measured: this device's telemetry; predicted: card device-class latency or the predictor"
    )
    latency_basis: Literal["device_telemetry", "card_device_class", "predictor"]
    latency_log_sigma: float = Field(description="one-sigma uncertainty of latency_ms in log space")
    memory_mb: float
    reason: str
    runner_up: CandidateSummary | None
    shortlist: list[ShortlistEntry] | None = Field(
        default=None, description="with shortlist_max_models: the models to time on the device, in order")


# calibration models ------------------------------------------------------------------------------

class CalibrationModelListQuery(StrictRequest):
    model_config = ConfigDict(extra="forbid", strict=False)  # query strings are text: "50" means 50

    limit: int = Field(default=50, ge=1, le=200)
    offset: int = Field(default=0, ge=0, le=10_000_000)


class CalibrationModel(Response):
    name: str = Field(description="the name a device reports its timing under (DeviceProfile.benchmarks[].model)")
    sha256: str = Field(pattern=SHA256_PATTERN, description="download from GET /v1/blobs/{sha256}")
    size_bytes: int


class CalibrationModelList(Response):
    calibration_models: list[CalibrationModel]
    total: int
    limit: int
    offset: int
    next_offset: int | None = Field(description="offset of the next page, or null on the last page")


# telemetry ---------------------------------------------------------------------------------------

class TelemetryRequest(StrictRequest):
    model_id: str = Field(pattern=IDENTIFIER_PATTERN)
    median_ms: float = Field(gt=0.0, le=3_600_000.0)
    p90_ms: float | None = Field(default=None, gt=0.0, le=3_600_000.0)
    threads: int | None = Field(default=None, ge=1, le=1024)


class TelemetryResponse(Response):
    device_id: str
    model_id: str
    measured_median_ms: float = Field(description="the median of this device's recent reports, used by lookups")
    reports: int


ErrorDetail.model_rebuild()

__all__ = [
    "BlobUploadResponse", "CalibrationModel", "CalibrationModelList", "CalibrationModelListQuery",
    "CandidateSummary", "DeviceProfile", "DeviceProfileRequest", "DeviceRegistration",
    "DeviceRevocation", "EnrollmentTokenList", "EnrollmentTokenListQuery", "EnrollmentTokenRequest",
    "EnrollmentTokenView", "ErrorResponse", "IssuedEnrollmentToken", "ModelCardRequest", "TokenRotation",
    "LookupRequest", "LookupResponse", "ModelCard", "ShortlistEntry", "ModelList", "ModelListQuery", "PublishResponse",
    "TelemetryRequest", "TelemetryResponse",
]


# device certificates (docs/privacy.md, "Who vouches for a device's key") ---------------------------------------

class SealedDocument(StrictRequest):
    """An operator-signed document (`fedzoo.device_certificates.seal`): the signed payload and its signature."""

    key_id: str = Field(pattern=r"^[0-9a-f]{16}$", description="the operator key that signed it")
    payload: str = Field(max_length=200_000, description="base64 of the signed JSON payload")
    signature: str = Field(max_length=100, description="base64 ed25519 signature over domain + payload")


class DeviceCertificateUpload(StrictRequest):
    certificate: SealedDocument


class DeviceCertificateReceipt(Response):
    device_id: str
    key_id: str
    expires_at: datetime


class SigningKeysQuery(StrictRequest):
    model_config = ConfigDict(extra="forbid", strict=False)  # query strings are text

    uncertified: bool = Field(default=False, description="only devices whose key has no certificate yet")
    limit: int = Field(default=50, ge=1, le=200)
    offset: int = Field(default=0, ge=0, le=10_000_000)


class DeviceSigningKey(Response):
    device_id: str
    signing_public_key: str = Field(description="base64 of the raw 32-byte ed25519 key")
    fingerprint: str = Field(description="hex sha256 of the key: how revocation lists name it")
    registered_at: datetime
    certificate_key_id: str | None = Field(description="the operator key of its certificate, or null")
    certificate_expires_at: datetime | None


class DeviceSigningKeyList(Response):
    devices: list[DeviceSigningKey]
    total: int
    limit: int
    offset: int
    next_offset: int | None
