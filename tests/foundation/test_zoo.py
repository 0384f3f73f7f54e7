"""The on-disk zoo: content-addressed blobs, cards that must point at intact blobs, atomic writes."""

import hashlib
import json

import pytest

from fedzoo.errors import InvalidInputError, NotFoundError
from fedzoo.zoo import Zoo, sha256_of_file

from cards_factory import make_card


def test_save_and_load_cards_and_blobs(tmp_path):
    zoo = Zoo.create(tmp_path / "zoo")
    digest = zoo.add_blob_bytes(b"onnx bytes")
    assert digest == hashlib.sha256(b"onnx bytes").hexdigest()
    assert sha256_of_file(zoo.blob_path(digest)) == digest
    card = make_card(sha256=digest)
    zoo.add_card(card)
    reopened = Zoo(tmp_path / "zoo")
    assert reopened.cards() == [card]
    assert reopened.card(card.id) == card
    assert reopened.model_path(card).read_bytes() == b"onnx bytes"
    assert len(reopened) == 1


def test_same_bytes_stored_once(tmp_path):
    zoo = Zoo.create(tmp_path)
    assert zoo.add_blob_bytes(b"x") == zoo.add_blob_bytes(b"x")
    assert len(list((tmp_path / "blobs").iterdir())) == 1


def test_card_without_its_blob_is_refused_and_nothing_written(tmp_path):
    zoo = Zoo.create(tmp_path)
    with pytest.raises(NotFoundError, match="blob"):
        zoo.add_card(make_card())
    assert zoo.cards() == []


def test_corrupt_blob_is_detected(tmp_path):
    zoo = Zoo.create(tmp_path)
    digest = zoo.add_blob_bytes(b"good")
    zoo.blob_path(digest).write_bytes(b"tampered")
    with pytest.raises(InvalidInputError, match="corrupt"):
        zoo.add_card(make_card(sha256=digest))


def test_missing_card_and_bad_digest_are_not_found(tmp_path):
    zoo = Zoo.create(tmp_path)
    with pytest.raises(NotFoundError):
        zoo.card("nope")
    with pytest.raises(NotFoundError):
        zoo.blob_path("../../etc/passwd")


def test_not_a_zoo(tmp_path):
    with pytest.raises(NotFoundError, match="not a fedzoo zoo"):
        Zoo(tmp_path)
    (tmp_path / "zoo.json").write_text(json.dumps({"format": "other", "format_version": 1}))
    with pytest.raises(InvalidInputError, match="expected 'fedzoo-zoo'"):
        Zoo(tmp_path)


def test_failed_write_leaves_no_temporary_files(tmp_path, monkeypatch):
    zoo = Zoo.create(tmp_path)
    digest = zoo.add_blob_bytes(b"model")
    monkeypatch.setattr("os.replace", lambda *args: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError):
        zoo.add_card(make_card(sha256=digest))
    assert list((tmp_path / "cards").iterdir()) == []
