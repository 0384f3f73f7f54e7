"""The operator's card-signing keys on disk: one PEM file per key, named by key id, in a key directory.

Layout::

    keys/                     mode 0700 ($FEDZOO_KEYS_DIR, default ~/.fedzoo/keys)
      <key id>.pem            an active private key (mode 0600): in the exported public key set
      retired/<key id>.pem    a retired key: no longer exported, so devices that refresh their pins drop it

Rotation adds a key before the old one is retired, so every device has pinned the new key by the time
cards signed with it arrive (see docs/signed-models.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from fedzoo.errors import InvalidInputError, NotFoundError
from fedzoo.signing import CardSigningKey, TrustedKeys

KEY_ID_LENGTH = 16


def default_keys_dir() -> Path:
    """`$FEDZOO_KEYS_DIR`, else `~/.fedzoo/keys`."""
    return Path(os.environ.get("FEDZOO_KEYS_DIR") or Path.home() / ".fedzoo" / "keys").expanduser()


@dataclass(frozen=True)
class StoredKey:
    """One key file: its id, where it is, when it was written, and whether it was retired."""

    key_id: str
    path: Path
    created_at: datetime
    retired: bool


class KeyDirectory:
    """The signing keys of one operator: generate, list, retire, and export the public half."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def generate(self) -> StoredKey:
        """A fresh ed25519 key, written owner-readable only into a directory only the owner can enter."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o700)
        key = CardSigningKey.generate()
        path = self.root / f"{key.key_id}.pem"
        key.save(path)
        return self._stored(path, retired=False)

    def keys(self) -> list[StoredKey]:
        """Active keys, then retired ones, each oldest first."""
        active = [self._stored(path, retired=False) for path in self._pem_files(self.root)]
        retired = [self._stored(path, retired=True) for path in self._pem_files(self.root / "retired")]
        return sorted(active, key=lambda key: key.created_at) + sorted(retired, key=lambda key: key.created_at)

    def active_public_keys(self) -> TrustedKeys:
        """The key set devices and servers pin: every active key, no retired one."""
        return TrustedKeys([CardSigningKey.load(key.path).public_key_raw for key in self.keys() if not key.retired])

    def retire(self, key_id: str) -> StoredKey:
        """Move an active key to `retired/`: it leaves the exported set and should sign nothing more."""
        path = self._active_path(key_id)
        target = self.root / "retired" / path.name
        target.parent.mkdir(mode=0o700, exist_ok=True)
        os.replace(path, target)
        return self._stored(target, retired=True)

    def _active_path(self, key_id: str) -> Path:
        if len(key_id) != KEY_ID_LENGTH or any(c not in "0123456789abcdef" for c in key_id):
            raise InvalidInputError(f"a key id is {KEY_ID_LENGTH} lowercase hex digits, got {key_id!r}", field="key_id")
        path = self.root / f"{key_id}.pem"
        if not path.is_file():
            raise NotFoundError(f"no active key {key_id} in {self.root}")
        return path

    @staticmethod
    def _pem_files(folder: Path) -> list[Path]:
        return sorted(folder.glob("*.pem")) if folder.is_dir() else []

    @staticmethod
    def _stored(path: Path, retired: bool) -> StoredKey:
        created_at = datetime.fromtimestamp(path.stat().st_mtime, tz=timezone.utc)
        return StoredKey(key_id=path.stem, path=path, created_at=created_at, retired=retired)
