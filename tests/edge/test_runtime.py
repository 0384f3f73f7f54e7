"""The inference wrapper: real onnxruntime sessions on a small calibration model, validated against a card."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from fedzoo.cards import InputSpec, Metrics, ModelCard, Normalisation
from fedzoo.edge.calibration_models import calibration_model
from fedzoo.edge.runtime import EdgeSession, create_session, session_options
from fedzoo.errors import InvalidInputError

MODEL = "cal-tiny-fp32"  # input ["batch", 1, 8, 8], 10 logits


@pytest.fixture(scope="module")
def model_bytes() -> bytes:
    return calibration_model(MODEL)


def make_card(model_bytes: bytes, **input_fields) -> ModelCard:
    spec = {"name": "input", "shape": ["batch", 1, 8, 8], **input_fields}
    return ModelCard(
        id="tiny",
        family="calibration",
        task="digits",
        input=InputSpec(**spec),
        labels=[str(i) for i in range(10)],
        metrics=Metrics(accuracy=0.5, num_examples=10),
        macs=1,
        params=1,
        size_bytes=len(model_bytes),
        sha256=hashlib.sha256(model_bytes).hexdigest(),
    )


def test_runs_a_batch_and_matches_a_plain_session(model_bytes: bytes) -> None:
    session = EdgeSession(model_bytes, make_card(model_bytes), threads=1)
    x = np.random.default_rng(0).random((3, 1, 8, 8), dtype=np.float32)
    logits = session.run(x)
    plain = create_session(model_bytes).run(None, {"input": x})[0]
    assert logits.shape == (3, 10)
    np.testing.assert_allclose(logits, plain, rtol=1e-5, atol=1e-6)
    assert session.predict(x) == np.argmax(plain, axis=1).tolist()


def test_applies_the_cards_normalisation(model_bytes: bytes) -> None:
    card = make_card(model_bytes, normalisation=Normalisation(mean=[0.5], std=[0.25]))
    session = EdgeSession(model_bytes, card)
    x = np.random.default_rng(1).random((2, 1, 8, 8), dtype=np.float32)
    expected = create_session(model_bytes).run(None, {"input": ((x - 0.5) / 0.25).astype(np.float32)})[0]
    np.testing.assert_allclose(session.run(x), expected, rtol=1e-5, atol=1e-5)
    raw = create_session(model_bytes).run(None, {"input": x})[0]
    np.testing.assert_allclose(session.run(x, normalise=False), raw, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("bad_input", "problem"),
    [
        (np.zeros((1, 1, 8, 9), np.float32), "dimension 3 is 9, expected 8"),
        (np.zeros((1, 8, 8), np.float32), "rank 3"),
        (np.zeros((0, 1, 8, 8), np.float32), "dimension 0 is 0"),
        (np.zeros((1, 1, 8, 8), np.float64), "dtype is float64, expected float32"),
        (np.full((1, 1, 8, 8), np.nan, np.float32), "64 NaN or infinite values"),
        ([[0.0] * 8] * 8, "must be a numpy array, got list"),
    ],
)
def test_bad_input_names_the_problem(model_bytes: bytes, bad_input: object, problem: str) -> None:
    session = EdgeSession(model_bytes, make_card(model_bytes))
    with pytest.raises(InvalidInputError, match=problem) as raised:
        session.run(bad_input)
    assert raised.value.field == "input"


def test_card_that_disagrees_with_the_model_is_refused(model_bytes: bytes) -> None:
    with pytest.raises(InvalidInputError, match="does not match the model's input 'input'") as raised:
        EdgeSession(model_bytes, make_card(model_bytes, name="pixels"))
    assert raised.value.field == "input.name"
    with pytest.raises(InvalidInputError, match="2 means for 1 input channels"):
        EdgeSession(model_bytes, make_card(model_bytes, normalisation=Normalisation(mean=[0, 0], std=[1, 1])))


def test_session_options_are_checked_and_applied() -> None:
    options = session_options(threads=2, graph_optimization="basic")
    assert options.intra_op_num_threads == 2
    with pytest.raises(InvalidInputError, match="unknown graph optimisation level 'fast'"):
        session_options(graph_optimization="fast")
    with pytest.raises(InvalidInputError, match="threads must be a positive integer"):
        session_options(threads=0)


def test_corrupt_model_is_an_invalid_input_error() -> None:
    with pytest.raises(InvalidInputError, match="onnxruntime cannot load the model") as raised:
        EdgeSession(b"not an onnx model")
    assert raised.value.field == "model"
