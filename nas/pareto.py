"""Pareto fronts of (score up, latency down) - accuracy, or the search's minus validation loss - the non-dominated sorting and crowding distance of
NSGA-II (Deb et al. 2002), and the 2-D hypervolume that scores a front."""

from __future__ import annotations

from collections.abc import Sequence

Point = tuple[float, float]  # (accuracy or another higher-is-better score, latency_ms)


def dominates(first: Point, second: Point) -> bool:
    """True when `first` is at least as accurate and as fast as `second`, and strictly better in one."""
    return first[0] >= second[0] and first[1] <= second[1] and (first[0] > second[0] or first[1] < second[1])


def non_dominated_fronts(points: Sequence[Point]) -> list[list[int]]:
    """Indices of `points` grouped into fronts: front 0 is the Pareto front, front 1 the front without it, ..."""
    remaining = list(range(len(points)))
    fronts: list[list[int]] = []
    while remaining:
        front = [i for i in remaining if not any(dominates(points[j], points[i]) for j in remaining if j != i)]
        fronts.append(front)
        remaining = [i for i in remaining if i not in front]
    return fronts


def pareto_front(points: Sequence[Point]) -> list[int]:
    """Indices of the non-dominated points, fastest first."""
    if not points:
        return []
    return sorted(non_dominated_fronts(points)[0], key=lambda i: (points[i][1], -points[i][0]))


def crowding_distances(points: Sequence[Point], front: Sequence[int]) -> dict[int, float]:
    """How isolated each point of a front is along both objectives (the extremes are infinitely so)."""
    distances = {i: 0.0 for i in front}
    for axis in (0, 1):
        ordered = sorted(front, key=lambda i: points[i][axis])
        span = points[ordered[-1]][axis] - points[ordered[0]][axis]
        distances[ordered[0]] = distances[ordered[-1]] = float("inf")
        if span <= 0:
            continue
        for previous, current, following in zip(ordered, ordered[1:], ordered[2:]):
            distances[current] += (points[following][axis] - points[previous][axis]) / span
    return distances


def hypervolume(points: Sequence[Point], reference: Point) -> float:
    """Area dominated by `points` and bounded by `reference` = (worst accuracy, worst latency_ms)."""
    inside = [p for p in points if p[0] > reference[0] and p[1] < reference[1]]
    area, best_accuracy = 0.0, reference[0]
    # sweep from fastest to slowest; each point adds the strip of accuracy it gains over faster points
    for accuracy, latency in sorted(inside, key=lambda p: (p[1], -p[0])):
        if accuracy > best_accuracy:
            area += (accuracy - best_accuracy) * (reference[1] - latency)
            best_accuracy = accuracy
    return area
