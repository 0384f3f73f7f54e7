"""Search for survivor stories that let a lying SecAgg+ server unmask a device, with and without the consistency check.

The server may show each honest device any survivor set (at most `--sets` distinct ones), and may forward
each dealer's shares to only some of its neighbours; every device survives and is honest. A device shown a
set signs it (only a set that holds itself), masks with the neighbours whose shares it got (it needs t of
them), and reveals, for each dealer it holds shares of, the seed share if the dealer is in its set, else the
mask-key share. Under the consistency check (`fedzoo.secagg`, stage 4) it reveals only when t of its
neighbours signed its very set. The server reads device 0's input when it recovers device 0's seed (t seed
shares) and, for every neighbour device 0 masked with, that neighbour's mask key (t mask-key shares).
The shuffled ring is a ring up to renaming, so positions stand for clients. The search is a 0/1 program
(scipy's HiGHS): "found" prints one attack, "none" means no assignment of that size exists.

    .venv/bin/python bench/secagg_story_search.py [--clients 30] [--neighbours 8] [--threshold 5]
        [--sets 1,2,4] [--time-limit-s 240]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp


class Program:
    """0/1 variables by name and linear rows lower <= sum(coefficient x) <= upper."""

    def __init__(self) -> None:
        self.index: dict[tuple, int] = {}
        self.rows: list[tuple[dict[int, float], float, float]] = []

    def var(self, *name: object) -> int:
        return self.index.setdefault(name, len(self.index))

    def row(self, coefficients: dict[int, float], lower: float, upper: float = np.inf) -> None:
        self.rows.append((coefficients, lower, upper))

    def both(self, result: int, first: int, second: int) -> None:
        """result <= first and result <= second (result may be 1 only where both are)."""
        self.row({result: 1, first: -1}, -np.inf, 0)
        self.row({result: 1, second: -1}, -np.inf, 0)

    def solve(self, time_limit_s: float) -> tuple[str, np.ndarray | None]:
        matrix = np.zeros((len(self.rows), len(self.index)))
        for number, (coefficients, _, _) in enumerate(self.rows):
            for column, value in coefficients.items():
                matrix[number, column] += value
        lower, upper = [row[1] for row in self.rows], [row[2] for row in self.rows]
        answer = milp(np.zeros(len(self.index)), integrality=np.ones(len(self.index)), bounds=Bounds(0, 1),
                      constraints=LinearConstraint(matrix, lower, upper), options={"time_limit": time_limit_s})
        return {0: "found", 2: "none"}.get(answer.status, "undecided (time limit)"), answer.x


def attack_program(clients: int, k: int, t: int, sets: int, consistency_check: bool) -> Program:
    ring = {c: [(c + step) % clients for step in range(-k // 2, k // 2 + 1) if step] for c in range(clients)}
    victim, program = 0, Program()
    for holder in range(clients):
        program.row({program.var("shown", holder, s): 1 for s in range(sets)}, 0, 1)
        program.row({program.var("forwarded", dealer, holder): 1 for dealer in ring[holder]}, t)  # t to mask with
        for s in range(sets):
            shown, reveals = program.var("shown", holder, s), program.var("reveals", holder, s)
            program.row({shown: 1, program.var("member", s, holder): -1}, -np.inf, 0)  # signs sets holding itself
            program.row({reveals: 1, shown: -1}, -np.inf, 0)
            if consistency_check:  # t neighbours signed the same set
                program.row({**{program.var("shown", peer, s): 1 for peer in ring[holder]}, reveals: -t}, 0)
    seed_shares = {}
    for holder in ring[victim]:
        for s in range(sets):
            share = seed_shares[holder, s] = program.var("seed share", holder, s)
            program.both(share, program.var("reveals", holder, s), program.var("member", s, victim))
            program.row({share: 1, program.var("forwarded", victim, holder): -1}, -np.inf, 0)
    program.row(dict.fromkeys(seed_shares.values(), 1), t)
    for peer in ring[victim]:  # each neighbour the victim masked with: t shares of its mask key
        key_shares = {}
        for holder in ring[peer]:
            for s in range(sets):
                share = key_shares[holder, s] = program.var("key share", peer, holder, s)
                program.row({share: 1, program.var("reveals", holder, s): -1}, -np.inf, 0)
                program.row({share: 1, program.var("member", s, peer): 1}, -np.inf, 1)  # peer not in the set
                program.row({share: 1, program.var("forwarded", peer, holder): -1}, -np.inf, 0)
        program.row({**dict.fromkeys(key_shares.values(), 1), program.var("forwarded", peer, victim): -t}, 0)
    return program


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=30)
    parser.add_argument("--neighbours", type=int, default=8)
    parser.add_argument("--threshold", type=int, default=5)
    parser.add_argument("--sets", default="1,2,4")
    parser.add_argument("--time-limit-s", type=float, default=240.0)
    arguments = parser.parse_args()
    print(f"n={arguments.clients}, k={arguments.neighbours}, t={arguments.threshold}: can the server unmask device 0?")
    for sets in [int(count) for count in arguments.sets.split(",")]:
        for consistency_check in (False, True):
            started = time.perf_counter()
            program = attack_program(arguments.clients, arguments.neighbours, arguments.threshold, sets,
                                     consistency_check)
            outcome, solution = program.solve(arguments.time_limit_s)
            rule = "with the consistency check" if consistency_check else "without it (v1 clients)"
            print(f"  up to {sets} distinct sets, {rule}: {outcome} ({time.perf_counter() - started:.1f} s)")
            if outcome == "found":
                for s in range(sets):
                    shown = [c for c in range(arguments.clients) if solution[program.index["shown", c, s]] > 0.5]
                    dropped = [c for c in range(arguments.clients) if solution[program.index["member", s, c]] < 0.5]
                    if shown:
                        print(f"    set {s}: shown to {shown}, says dropped {dropped}")


if __name__ == "__main__":
    main()
