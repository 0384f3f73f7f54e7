"""FLTrust's decisions one update at a time, as an insider would probe them: an update exactly orthogonal to the
server's root update, one exactly at the norm bound, one boosted past it, and under SecAgg+ an aggregate that
points nowhere or is boosted; the server's own update trained on a real root set. Real `ClientUpdate`s,
`RootTrust` settings and onnxruntime training; the round tests in
test_fl_robust.py run the same code inside a real round."""

from __future__ import annotations

import io

import numpy as np
import pytest

from fedzoo.aggregation.direction import delta_norm
from fedzoo.aggregation.screening import Screened
from fedzoo.aggregation.strategies import ClientUpdate
from fedzoo.edge.onnx_initializers import read_float_initializers
from fedzoo.errors import InvalidInputError
from fedzoo.server.fl.root_trust import RootUpdate, check_aggregate, score_updates, summary, train_root_update
from fedzoo.server.fl.schemas import RootTrust, TrainingConfig
from fedzoo.update_codec import split_statistics

ROOT = RootUpdate({"w": np.array([1.0, 0.0, 0.0], np.float32)}, norm=1.0, num_examples=150, seconds=0.5)


def _settings(**fields) -> RootTrust:
    return RootTrust(root_sha256="a" * 64, **fields)


def _counted(device_id: str, delta: list[float], num_examples: float = 100.0) -> Screened:
    vector = np.array(delta, np.float32)
    update = ClientUpdate(device_id, num_examples, lambda: {"w": vector}, float(np.linalg.norm(vector)))
    return Screened(update, "counted", None, update)


def _rejected(device_id: str) -> Screened:
    update = ClientUpdate(device_id, 100.0, lambda: {"w": np.ones(3, np.float32)}, 3 ** 0.5)
    return Screened(update, "rejected", "norm above the bound", None)


def test_an_update_orthogonal_to_the_root_update_is_left_out_at_the_default_threshold():
    """Cosine exactly 0 is "at most min_cosine": an insider cannot slip in a delta that adds nothing along the
    server's direction and everything across it."""
    [decision] = score_updates([_counted("across", [0.0, 0.5, 0.0])], ROOT, _settings())
    assert decision.outcome == "rejected" and decision.update is None and decision.root_cosine == 0.0
    assert "left out" in decision.reason


def test_an_update_at_the_configured_threshold_is_left_out_and_one_just_above_counts():
    at, above = score_updates([_counted("at", [3.0, 4.0, 0.0]), _counted("above", [4.0, 3.0, 0.0])], ROOT,
                              _settings(min_cosine=0.6, max_norm_ratio=10.0))  # cosines 3 / 5, 4 / 5: exact
    assert at.update is None and at.outcome == "rejected" and at.root_cosine == 0.6
    assert above.update is not None and above.outcome == "counted" and above.root_cosine == pytest.approx(0.8)


def test_a_flipped_update_is_left_out_whatever_it_claims():
    [decision] = score_updates([_counted("flipped", [-3.0, 0.0, 0.0], num_examples=10_000)], ROOT, _settings())
    assert decision.update is None and decision.root_cosine == pytest.approx(-1.0)
    assert decision.original.device_id == "flipped"


def test_an_agreeing_update_weighs_its_examples_times_its_cosine_and_keeps_its_delta():
    [decision] = score_updates([_counted("agrees", [0.375, 0.5, 0.0], num_examples=200)], ROOT, _settings())
    assert decision.outcome == "counted" and decision.root_cosine == pytest.approx(0.6)
    assert decision.update.num_examples == pytest.approx(200 * 0.6)
    np.testing.assert_array_equal(decision.update.load_delta()["w"], [0.375, 0.5, 0.0])
    assert decision.update.norm == 0.625 and "weight 200 x 0.600" in decision.reason


def test_a_boosted_update_is_scaled_down_to_the_ratio_times_the_root_norm():
    """Model replacement: an update 10 x an honest one's length keeps at most max_norm_ratio x the root's."""
    root = RootUpdate({"w": np.array([0.5, 0.0, 0.0], np.float32)}, norm=0.5, num_examples=150, seconds=0.5)
    [decision] = score_updates([_counted("boosted", [6.0, 8.0, 0.0])], root, _settings(max_norm_ratio=4.0))
    assert decision.outcome == "clipped" and decision.update.norm == pytest.approx(2.0)
    np.testing.assert_allclose(decision.update.load_delta()["w"], [1.2, 1.6, 0.0], rtol=1e-6)
    assert np.linalg.norm(decision.update.load_delta()["w"]) == pytest.approx(2.0, rel=1e-6)
    assert decision.update.num_examples == pytest.approx(100 * 0.6) and "norm scaled by 0.2" in decision.reason


def test_an_update_exactly_at_the_norm_bound_is_counted_as_sent():
    [decision] = score_updates([_counted("at-bound", [2.0, 0.0, 0.0])], ROOT, _settings(max_norm_ratio=2.0))
    assert decision.outcome == "counted" and decision.update.norm == 2.0
    np.testing.assert_array_equal(decision.update.load_delta()["w"], [2.0, 0.0, 0.0])


def test_updates_rejected_before_scoring_stay_rejected_and_the_order_is_kept():
    decisions = [_counted("first", [1.0, 0.0, 0.0]), _rejected("screened-out"), _counted("across", [0.0, 0.0, -1.0]),
                 _counted("flipped", [-1.0, 0.0, 0.0])]
    root = RootUpdate(ROOT.delta, ROOT.norm, ROOT.num_examples, seconds=0.123456)
    scored = score_updates(decisions, root, _settings())
    assert [d.original.device_id for d in scored] == ["first", "screened-out", "across", "flipped"]
    assert scored[1] is decisions[1]
    assert [d.update is None for d in scored] == [False, True, True, True]
    found = summary(root, scored, _settings())
    assert found == {"root_examples": 150, "root_update_norm": 1.0, "min_cosine": 0.0, "left_out": 2,
                     "median_cosine": pytest.approx(0.0), "seconds": 0.1235}
    assert summary(root, [_rejected("screened-out")], _settings())["median_cosine"] is None


def test_scoring_keeps_what_screening_already_recorded_about_an_update():
    earlier = [Screened(decision.original, "clipped", "norm scaled by 0.5", decision.update)
               for decision in (_counted("kept", [1.0, 0.0, 0.0]), _counted("left-out", [-1.0, 0.0, 0.0]))]
    kept, left_out = score_updates(earlier, ROOT, _settings())
    assert kept.outcome == "clipped" and kept.reason.startswith("norm scaled by 0.5; cosine 1.000")
    assert left_out.outcome == "rejected" and left_out.reason.startswith("norm scaled by 0.5; cosine -1.000")


def test_the_aggregate_check_refuses_an_aggregate_orthogonal_to_the_root_update():
    base = {"w": np.zeros(3, np.float32)}
    with pytest.raises(InvalidInputError, match="cosine 0.000") as error:
        check_aggregate(base, {"w": np.array([0.0, 2.0, 0.0], np.float32)}, ROOT, _settings())
    assert error.value.field == "root_trust"
    with pytest.raises(InvalidInputError, match="cosine 0.600"):
        check_aggregate(base, {"w": np.array([3.0, 4.0, 0.0], np.float32)}, ROOT, _settings(min_cosine=0.6))


def test_the_aggregate_check_never_scales_an_aggregate_up_and_bounds_it_from_the_base():
    base = {"w": np.array([1.0, 1.0, 1.0], np.float32)}
    small, found = check_aggregate(base, {"w": np.array([1.3, 1.4, 1.0], np.float32)}, ROOT, _settings())
    np.testing.assert_allclose(small["w"], [1.3, 1.4, 1.0], rtol=1e-6)  # norm 0.5 within 1 x the root's 1
    assert small["w"].dtype == np.float32 and found["scaled_by"] == 1.0
    assert found["aggregate_norm"] == pytest.approx(0.5) and found["root_examples"] == 150
    boosted, found = check_aggregate(base, {"w": np.array([7.0, 9.0, 1.0], np.float32)}, ROOT, _settings())
    np.testing.assert_allclose(boosted["w"], [1.6, 1.8, 1.0], rtol=1e-6)  # delta (6, 8, 0) scaled to norm 1
    assert found["scaled_by"] == pytest.approx(0.1) and found["aggregate_cosine"] == pytest.approx(0.6)


def test_the_aggregate_bound_is_the_ratio_times_the_root_norm_also_below_unit_norms():
    root = RootUpdate({"w": np.array([0.25, 0.0, 0.0], np.float32)}, norm=0.25, num_examples=150, seconds=0.123456)
    base = {"w": np.zeros(3, np.float32)}
    bounded, found = check_aggregate(base, {"w": np.array([0.375, 0.5, 0.0], np.float32)}, root,
                                     _settings(max_norm_ratio=1.2))  # norm 0.625 above 1.2 x 0.25 = 0.3
    assert found["scaled_by"] == pytest.approx(0.48) and found["root_update_norm"] == 0.25
    assert found["seconds"] == 0.1235
    np.testing.assert_allclose(bounded["w"], [0.18, 0.24, 0.0], rtol=1e-6)


def _root_npz(federation, count: int) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, x=federation.split.validation.x[:count], y=federation.split.validation.y[:count])
    return buffer.getvalue()


def test_the_root_update_is_trained_on_the_root_set_and_a_set_it_cannot_learn_from_is_refused(federation):
    training = TrainingConfig(local_epochs=1, batch_size=16, learning_rate=0.1, optimizer="sgd", momentum=0.0)
    root_npz = _root_npz(federation, 48)
    root = train_root_update(federation.model, federation.training_graph, federation.card, training, root_npz, seed=1)
    assert root.num_examples == 48 and 0 < root.seconds < 600
    assert root.norm > 0 and root.norm == pytest.approx(delta_norm(root.delta))
    assert set(root.delta) == set(split_statistics(read_float_initializers(federation.model))[0])
    again = train_root_update(federation.model, federation.training_graph, federation.card, training, root_npz, seed=1)
    other = train_root_update(federation.model, federation.training_graph, federation.card, training, root_npz, seed=2)
    assert again.norm == root.norm and other.norm != root.norm  # the round's seed orders the root set's batches
    # a step too small to move a float32 weight leaves no direction to score against; one too large, no finite one
    for learning_rate, norm in ((1e-30, "norm 0.0"), (1e38, "norm (nan|inf)")):
        with pytest.raises(InvalidInputError, match=norm) as refused:
            train_root_update(federation.model, federation.training_graph, federation.card,
                              training.model_copy(update={"learning_rate": learning_rate}), root_npz, seed=0)
        assert refused.value.field == "root_trust.root_sha256"


def test_a_root_set_holding_pickled_objects_is_never_unpickled(federation):
    """The root set is a blob: loading it must not run code, whatever the archive holds."""
    buffer = io.BytesIO()
    np.savez(buffer, x=np.array([{"not": "data"}], dtype=object), y=np.zeros(1, np.int64))
    training = TrainingConfig(local_epochs=1, batch_size=16, learning_rate=0.1, optimizer="sgd", momentum=0.0)
    with pytest.raises(ValueError, match="allow_pickle=False"):
        train_root_update(federation.model, federation.training_graph, federation.card, training, buffer.getvalue(),
                          seed=0)
