"""The on-disk model zoo: model cards plus blobs (ONNX models, weights, training graphs) addressed by sha256.

Layout::

    zoo/
      zoo.json               {"format": "fedzoo-zoo", "format_version": 1}
      cards/<card id>.json   one ModelCard each
      blobs/<sha256>         content-addressed files

Every write goes to a temporary file in the same folder and is then renamed into place, so an
interrupted or failed write never leaves a half-written card or blob behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from datetime import timedelta
from pathlib import Path

from fedzoo.cards import ModelCard
from fedzoo.errors import InvalidInputError, NotFoundError
from fedzoo.signing import DEFAULT_CARD_LIFETIME, CardSigningKey, sign_card

ZOO_FORMAT = "fedzoo-zoo"
ZOO_FORMAT_VERSION = 1
_CHUNK_BYTES = 1 << 20


def sha256_of_file(path: str | Path) -> str:
    """Hex sha256 of a file's bytes, read in chunks so large blobs need little memory."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for chunk in iter(lambda: stream.read(_CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


def atomic_write_bytes(path: Path, data: bytes, fsync: bool = True) -> None:
    """Write `data` to `path` so readers see either the old file or the whole new one; with `fsync` the bytes
    are on disk before the file appears (a power cut leaves the old file or the new one, never a torn one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "wb") as stream:
            stream.write(data)
            stream.flush()
            if fsync:
                os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


class Zoo:
    """A zoo directory: open an existing one with `Zoo(path)`, make one with `Zoo.create(path)`."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        manifest = self.root / "zoo.json"
        if not manifest.is_file():
            raise NotFoundError(f"{self.root} is not a fedzoo zoo: {manifest} is missing")
        try:
            header = json.loads(manifest.read_text())
        except json.JSONDecodeError as error:
            raise InvalidInputError(f"{manifest} is not valid JSON: {error}") from None
        if header.get("format") != ZOO_FORMAT or header.get("format_version") != ZOO_FORMAT_VERSION:
            raise InvalidInputError(
                f"{manifest} declares {header.get('format')!r} version {header.get('format_version')!r}; "
                f"expected {ZOO_FORMAT!r} version {ZOO_FORMAT_VERSION}"
            )

    @classmethod
    def create(cls, root: str | Path) -> Zoo:
        """Make an empty zoo at `root` (or open the zoo already there)."""
        root = Path(root)
        manifest = root / "zoo.json"
        if not manifest.exists():
            header = {"format": ZOO_FORMAT, "format_version": ZOO_FORMAT_VERSION}
            atomic_write_bytes(manifest, json.dumps(header, indent=2).encode())
        (root / "cards").mkdir(exist_ok=True)
        (root / "blobs").mkdir(exist_ok=True)
        return cls(root)

    # blobs -----------------------------------------------------------------------------------

    def blob_path(self, sha256: str) -> Path:
        """Where the blob with this digest lives; raises NotFoundError if it is not stored."""
        path = self.root / "blobs" / sha256
        if len(sha256) != 64 or not all(c in "0123456789abcdef" for c in sha256) or not path.is_file():
            raise NotFoundError(f"blob {sha256!r} is not in the zoo at {self.root}")
        return path

    def add_blob_bytes(self, data: bytes) -> str:
        """Store bytes as a blob and return their sha256 (storing the same bytes twice is a no-op)."""
        digest = hashlib.sha256(data).hexdigest()
        target = self.root / "blobs" / digest
        if not target.exists():
            atomic_write_bytes(target, data)
        return digest

    def add_blob_file(self, path: str | Path) -> str:
        """Store a file's bytes as a blob and return their sha256."""
        return self.add_blob_bytes(Path(path).read_bytes())

    # cards -----------------------------------------------------------------------------------

    def add_card(self, card: ModelCard) -> None:
        """Store a card; its model blob (and every artifact it names) must already be stored and intact."""
        for kind, digest in {"model": card.sha256, **card.artifacts}.items():
            actual = sha256_of_file(self.blob_path(digest))
            if actual != digest:
                raise InvalidInputError(f"{kind} blob {digest} is corrupt in {self.root}: its bytes hash to {actual}")
        if card.training_graph is not None:
            self.blob_path(card.training_graph)
        atomic_write_bytes(self.root / "cards" / f"{card.id}.json", card.to_json().encode())

    def sign_cards(self, key: CardSigningKey, lifetime: timedelta = DEFAULT_CARD_LIFETIME) -> list[ModelCard]:
        """Sign every card with `key` (replacing any older signature, e.g. of a retired key or after a later
        stage changed the card); returns the signed cards."""
        signed = [sign_card(card, key, lifetime) for card in self.cards()]
        for card in signed:
            atomic_write_bytes(self.root / "cards" / f"{card.id}.json", card.to_json().encode())
        return signed

    def card(self, card_id: str) -> ModelCard:
        """The card with this id; raises NotFoundError if there is none."""
        path = self.root / "cards" / f"{card_id}.json"
        if "/" in card_id or card_id.startswith(".") or not path.is_file():
            raise NotFoundError(f"no model card {card_id!r} in the zoo at {self.root}")
        return ModelCard.from_json(path.read_bytes())

    def cards(self) -> list[ModelCard]:
        """All cards, sorted by id so listings are stable."""
        return [ModelCard.from_json(path.read_bytes()) for path in sorted((self.root / "cards").glob("*.json"))]

    def __len__(self) -> int:
        return len(list((self.root / "cards").glob("*.json")))

    def model_path(self, card: ModelCard) -> Path:
        """The ONNX file of a card."""
        return self.blob_path(card.sha256)
