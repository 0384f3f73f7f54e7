"""The model card: the versioned JSON contract between cloud, server and devices (see docs/design.md)."""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fedzoo.errors import InvalidInputError

CARD_SCHEMA_VERSION = 1
SHA256_PATTERN = r"^[0-9a-f]{64}$"
IDENTIFIER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class Normalisation(_Strict):
    """Per-channel `(x - mean) / std` the device applies before feeding the model."""

    mean: list[float] = Field(min_length=1)
    std: list[float] = Field(min_length=1)

    @model_validator(mode="after")
    def _same_length_positive_std(self) -> Normalisation:
        if len(self.mean) != len(self.std):
            raise ValueError(f"mean has {len(self.mean)} values but std has {len(self.std)}")
        if any(s <= 0 for s in self.std):
            raise ValueError(f"std must be positive, got {self.std}")
        return self


class InputSpec(_Strict):
    """The model's single input: name, shape with a symbolic batch dimension, dtype and normalisation."""

    name: str = Field(min_length=1)
    shape: list[int | str] = Field(min_length=1, description='e.g. ["batch", 1, 28, 28]')
    dtype: Literal["float32"] = "float32"
    normalisation: Normalisation | None = None

    @field_validator("shape")
    @classmethod
    def _dims_positive_or_symbolic(cls, shape: list[int | str]) -> list[int | str]:
        for dim in shape:
            if isinstance(dim, int) and dim <= 0:
                raise ValueError(f"dimensions must be positive or symbolic, got {dim}")
            if isinstance(dim, str) and not dim:
                raise ValueError("a symbolic dimension needs a name")
        return shape


class Pruning(_Strict):
    """How much of the parent's channels were removed, and by which importance criterion."""

    ratio: float = Field(ge=0.0, lt=1.0)
    method: str = Field(min_length=1, description="e.g. l1, l2, bn-scale")


class Metrics(_Strict):
    """Quality measured on a held-out split the model never trained on."""

    accuracy: float = Field(ge=0.0, le=1.0)
    loss: float | None = Field(default=None, ge=0.0)
    split: str = "test"
    num_examples: int = Field(ge=1)


class Latency(_Strict):
    """Latency of one batch-1 inference on one device class, and whether it was measured or predicted."""

    median_ms: float = Field(gt=0.0)
    p90_ms: float | None = Field(default=None, gt=0.0)
    source: Literal["measured", "predicted"]
    threads: int | None = Field(default=None, ge=1)


class CardSignature(_Strict):
    """An ed25519 signature over the whole card but `signature` and `unsigned` (see `fedzoo.signing`).

    The signed bytes travel with it, base64-encoded, so a verifier in any language checks exactly those bytes
    and then compares the card they hold with the card, with no canonical re-encoding to agree on.
    """

    key_id: str = Field(pattern=r"^[0-9a-f]{16}$")
    algorithm: Literal["ed25519"] = "ed25519"
    payload: str = Field(min_length=1, description="base64 of the signed JSON fields")
    signature: str = Field(min_length=1, description="base64 of the 64-byte ed25519 signature")


class ModelCard(_Strict):
    """Everything a server needs to choose this model for a device, and a device needs to run it."""

    schema_version: int = CARD_SCHEMA_VERSION
    id: str = Field(pattern=IDENTIFIER_PATTERN)
    family: str = Field(min_length=1)
    version: int = Field(default=1, ge=1)
    parent_id: str | None = Field(default=None, pattern=IDENTIFIER_PATTERN)
    line: str | None = Field(default=None, pattern=IDENTIFIER_PATTERN, description=(
        "the model line this version continues: the id of its first version (null: this card starts a line); "
        "rollback and the privacy ledger are kept per line"))
    task: str = Field(pattern=IDENTIFIER_PATTERN, description="what the model does, e.g. mnist")
    input: InputSpec
    labels: list[str] = Field(min_length=2)
    arch: dict[str, Any] = Field(default_factory=dict, description="the subnet configuration")
    precision: Literal["fp32", "int8"] = "fp32"
    pruning: Pruning | None = None
    metrics: Metrics
    macs: int = Field(ge=0)
    params: int = Field(ge=0)
    size_bytes: int = Field(ge=1)
    sha256: str = Field(pattern=SHA256_PATTERN, description="of the ONNX blob")
    latency_ms: dict[str, Latency] = Field(default_factory=dict, description="keyed by device class")
    training_graph: str | None = Field(default=None, pattern=SHA256_PATTERN)
    artifacts: dict[str, str] = Field(
        default_factory=dict, description="other blobs by kind (e.g. torch_state), each a sha256"
    )
    details: dict[str, Any] = Field(default_factory=dict, description="provenance: quantization, lineage")
    created_at: datetime = Field(default_factory=lambda: datetime.now(timezone.utc))
    signature: CardSignature | None = Field(default=None, description="by the publisher's key; null if unsigned")
    unsigned: dict[str, Any] = Field(default_factory=dict, description=(
        "server measurements that change after publication (the fleet latency factor); outside the signature, "
        "so a device never acts on them"))

    @field_validator("schema_version")
    @classmethod
    def _known_schema(cls, version: int) -> int:
        if version != CARD_SCHEMA_VERSION:
            raise ValueError(f"unsupported card schema version {version}; this fedzoo reads {CARD_SCHEMA_VERSION}")
        return version

    @field_validator("artifacts")
    @classmethod
    def _artifacts_are_hashes(cls, artifacts: dict[str, str]) -> dict[str, str]:
        for kind, digest in artifacts.items():
            if not re.fullmatch(SHA256_PATTERN, digest):
                raise ValueError(f"artifact {kind!r} must be a sha256 hex digest, got {digest!r}")
        return artifacts

    @property
    def line_id(self) -> str:
        """The model line this card belongs to (its own id when it starts one)."""
        return self.line or self.id

    def to_json(self) -> str:
        """The card as pretty JSON, the form stored in a zoo and served over REST."""
        return self.model_dump_json(indent=2)

    @classmethod
    def from_json(cls, text: str | bytes) -> ModelCard:
        """Parse and validate a card; errors name the offending field."""
        try:
            return cls.model_validate_json(text)
        except ValidationError as error:
            raise card_error(error) from None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelCard:
        """Validate a card given as a dict; errors name the offending field."""
        try:
            return cls.model_validate(data)
        except ValidationError as error:
            raise card_error(error) from None


SUPERNET_DETAILS = "supernet"  # details key of a zoo's supernet card (fedzoo.compress.zoo_extraction)


def is_supernet(card: ModelCard) -> bool:
    """A zoo's supernet card: data for zoo-wide federated plans, never compressed, trained or served itself."""
    return SUPERNET_DETAILS in card.details


def card_error(error: ValidationError) -> InvalidInputError:
    """Turn pydantic's report into one error naming the first bad field, e.g. `metrics.accuracy`."""
    first = error.errors()[0]
    field = ".".join(str(part) for part in first["loc"]) or None
    where = f"field '{field}'" if field else "card"
    return InvalidInputError(f"invalid model card {where}: {first['msg']}", field=field)


def card_json_schema() -> dict[str, Any]:
    """The JSON Schema of the card, for documentation and the server's OpenAPI document."""
    return ModelCard.model_json_schema()
