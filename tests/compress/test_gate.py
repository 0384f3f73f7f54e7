from fedzoo.compress.gate import LATENCY_MARGIN, judge, pick_fastest
from fedzoo.compress.measure import Measurement


def measured(accuracy=0.95, latency_ms=1.0, size_bytes=1000) -> Measurement:
    return Measurement(accuracy, 0.2, 500, latency_ms, latency_ms * 1.1, size_bytes)


def test_within_tolerance_and_smaller_is_accepted_even_if_not_faster():
    decision = judge(measured(accuracy=0.942, latency_ms=1.2, size_bytes=300), measured(), tolerance_points=1.0)
    assert decision.accepted and decision.reasons == []
    assert any("size only" in note for note in decision.notes)


def test_faster_but_not_smaller_is_accepted():
    assert judge(measured(latency_ms=0.5, size_bytes=1200), measured()).accepted


def test_too_large_an_accuracy_drop_is_rejected_with_the_numbers():
    decision = judge(measured(accuracy=0.93, size_bytes=300), measured(accuracy=0.95), tolerance_points=1.0)
    assert not decision.accepted
    assert decision.reasons == ["accuracy 93.00% is 2.00 points below the parent's 95.00% (tolerance 1.00)"]


def test_neither_faster_nor_smaller_is_rejected():
    slightly_faster = 1.0 - LATENCY_MARGIN / 2  # within measurement noise: does not count
    decision = judge(measured(latency_ms=slightly_faster, size_bytes=1000), measured())
    assert not decision.accepted and "neither faster" in decision.reasons[0]


def test_both_rules_can_fail_at_once():
    decision = judge(measured(accuracy=0.5, latency_ms=2.0, size_bytes=2000), measured())
    assert len(decision.reasons) == 2


def test_a_better_variant_passes_a_zero_tolerance():
    assert judge(measured(accuracy=0.96, size_bytes=10), measured(accuracy=0.95), tolerance_points=0.0).accepted


def test_pick_fastest_prefers_speed_then_size_within_the_noise_margin():
    parent = measured()
    candidates = {
        "slow-small": measured(latency_ms=2.0, size_bytes=100),
        "fast-big": measured(latency_ms=1.0, size_bytes=400),
        "as-fast-smaller": measured(latency_ms=1.0 + LATENCY_MARGIN / 2, size_bytes=300),
        "fastest-inaccurate": measured(accuracy=0.90, latency_ms=0.5, size_bytes=50),
    }
    assert pick_fastest(candidates, parent, tolerance_points=1.0) == "as-fast-smaller"


def test_pick_fastest_falls_back_to_the_most_accurate_when_none_is_within_tolerance():
    candidates = {"a": measured(accuracy=0.80, latency_ms=0.5), "b": measured(accuracy=0.85, latency_ms=3.0)}
    assert pick_fastest(candidates, measured(accuracy=0.95), tolerance_points=1.0) == "b"


def test_recipes_with_the_same_kernels_tie_on_latency_so_the_smaller_wins():
    """A timing gap between two files of one kernel list is noise: it must not pick the larger file."""
    parent = measured()
    candidates = {
        "per-channel": measured(latency_ms=1.0, size_bytes=400),
        "per-tensor": measured(latency_ms=1.0 + 3 * LATENCY_MARGIN, size_bytes=380),
        "other-kernels": measured(latency_ms=1.0 + 2 * LATENCY_MARGIN, size_bytes=100),
    }
    assert pick_fastest(candidates, parent) == "per-channel"  # timed apart, the noise decides
    signatures = {"per-channel": "kernels-a", "per-tensor": "kernels-a", "other-kernels": "kernels-b"}
    assert pick_fastest(candidates, parent, kernel_signatures=signatures) == "per-tensor"


def test_a_same_kernel_tie_does_not_rescue_an_inaccurate_candidate():
    parent = measured()
    candidates = {"accurate": measured(latency_ms=1.0, size_bytes=400), "inaccurate": measured(accuracy=0.90, size_bytes=10)}
    assert pick_fastest(candidates, parent, kernel_signatures={"accurate": 1, "inaccurate": 1}) == "accurate"
