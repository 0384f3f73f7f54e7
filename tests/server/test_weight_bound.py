"""The weight bound as an insider probes it: a claim exactly at k x the median, a round where screening already
left updates out (they neither count towards the median nor get a weight back), a round with nothing counted.
Real `ClientUpdate`s and `WeightBound` settings; test_fl_robust.py runs the same rule inside a real round."""

from __future__ import annotations

import numpy as np
import pytest

from fedzoo.aggregation.screening import Screened
from fedzoo.aggregation.strategies import ClientUpdate
from fedzoo.aggregation.weighting import bound_weights
from fedzoo.server.fl.schemas import WeightBound


def _update(device_id: str, num_examples: float) -> ClientUpdate:
    return ClientUpdate(device_id, num_examples, lambda: {"w": np.ones(2, np.float32)}, 2 ** 0.5)


def _counted(device_id: str, num_examples: float) -> Screened:
    update = _update(device_id, num_examples)
    return Screened(update, "counted", None, update)


def _rejected(device_id: str, num_examples: float) -> Screened:
    return Screened(_update(device_id, num_examples), "rejected", "revoked", None)


def test_a_claim_exactly_at_k_times_the_median_keeps_its_weight_and_no_note():
    decisions, cap = bound_weights([_counted("a", 100), _counted("b", 200), _counted("c", 400)],
                                   WeightBound(median_multiple=2.0))
    assert cap == 400.0 and [d.update.num_examples for d in decisions] == [100, 200, 400]
    assert [d.reason for d in decisions] == [None, None, None]


def test_updates_left_out_by_screening_neither_move_the_median_nor_get_a_weight():
    """Three claims of 10,000 already rejected would make the median 10,000 if they counted; they do not."""
    decisions = [_counted("a", 100), _rejected("x", 10_000), _counted("b", 100), _rejected("y", 10_000),
                 _rejected("z", 10_000), _counted("insider", 10_000)]
    bounded, cap = bound_weights(decisions, WeightBound(median_multiple=2.0))
    assert cap == 200.0
    assert [d.original.device_id for d in bounded] == ["a", "x", "b", "y", "z", "insider"]
    assert all(bounded[index] is decisions[index] for index in (1, 3, 4))
    assert bounded[5].update.num_examples == 200.0 and bounded[5].outcome == "counted"
    assert bounded[5].reason == "weight capped at 200 examples (2 x the round's median 100); 10000 counted"
    assert bounded[5].original.num_examples == 10_000  # the claim itself stays on record


def test_a_cap_note_is_added_to_an_earlier_decisions_reason():
    clipped_update = _update("clipped", 5_000)
    clipped = Screened(clipped_update, "clipped", "norm scaled by 0.5", clipped_update)
    bounded, _ = bound_weights([_counted("a", 100), _counted("b", 100), clipped], WeightBound(median_multiple=3.0))
    assert bounded[2].outcome == "clipped" and bounded[2].update.num_examples == 300.0
    assert bounded[2].reason.startswith("norm scaled by 0.5; weight capped at 300 examples (3 x")


@pytest.mark.parametrize("rule", ["median_multiple", "equal", "examples"])
def test_a_round_with_nothing_counted_is_returned_as_it_is(rule):
    decisions = [_rejected("x", 10_000), _rejected("y", 5)]
    bounded, cap = bound_weights(decisions, WeightBound(rule=rule))
    assert cap is None and bounded == decisions


def test_under_equal_weights_every_counted_update_weighs_one_and_rejected_ones_nothing():
    decisions = [_counted("a", 100), _rejected("x", 7), _counted("insider", 10_000)]
    bounded, cap = bound_weights(decisions, WeightBound(rule="equal"))
    assert cap is None and bounded[1] is decisions[1]
    assert [bounded[0].update.num_examples, bounded[2].update.num_examples] == [1.0, 1.0]
    assert bounded[2].reason is None
