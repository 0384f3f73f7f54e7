"""The model card contract: JSON round trip, schema version, and errors that name the field."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fedzoo.cards import CARD_SCHEMA_VERSION, Metrics, ModelCard, card_json_schema
from fedzoo.errors import InvalidInputError

from cards_factory import make_card


def test_json_round_trip_preserves_every_field():
    card = make_card(artifacts={"torch_state": "cd" * 32}, details={"quantization": {"method": "qdq"}})
    again = ModelCard.from_json(card.to_json())
    assert again == card
    assert json.loads(card.to_json())["schema_version"] == CARD_SCHEMA_VERSION


def bad_payload(path: str, value) -> dict:
    data = json.loads(make_card().to_json())
    target = data
    *parents, leaf = path.split(".")
    for key in parents:
        target = target[key]
    target[leaf] = value
    return data


@pytest.mark.parametrize(
    "path, value",
    [
        ("metrics.accuracy", 1.5),
        ("metrics.accuracy", "high"),
        ("sha256", "not-a-hash"),
        ("id", "../escape"),
        ("precision", "fp64"),
        ("input.shape", [0, 1, 28, 28]),
        ("labels", ["only-one"]),
        ("schema_version", 99),
        ("size_bytes", 0),
    ],
)
def test_invalid_field_is_named(path, value):
    with pytest.raises(InvalidInputError) as error:
        ModelCard.from_dict(bad_payload(path, value))
    assert error.value.field == path
    assert path in str(error.value)


def test_unknown_field_is_rejected_by_name():
    data = json.loads(make_card().to_json())
    data["acuracy"] = 0.9
    with pytest.raises(InvalidInputError, match="acuracy"):
        ModelCard.from_dict(data)


def test_malformed_json_is_a_clear_error():
    with pytest.raises(InvalidInputError, match="invalid model card"):
        ModelCard.from_json("{not json")


def test_normalisation_lengths_must_match():
    data = json.loads(make_card().to_json())
    data["input"]["normalisation"] = {"mean": [0.1, 0.2], "std": [0.3]}
    with pytest.raises(InvalidInputError, match="input.normalisation"):
        ModelCard.from_dict(data)


def test_json_schema_lists_required_fields():
    schema = card_json_schema()
    assert {"id", "task", "input", "metrics", "sha256"} <= set(schema["required"])


@given(accuracy=st.floats(min_value=0, max_value=1), macs=st.integers(min_value=0, max_value=10**12))
def test_round_trip_property(accuracy, macs):
    card = make_card(metrics=Metrics(accuracy=accuracy, num_examples=1), macs=macs)
    assert ModelCard.from_json(card.to_json()) == card
