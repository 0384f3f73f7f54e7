"""Mutation testing of the security-critical modules with mutmut: which one-token edits the tests do not notice.

Run by hand or nightly, never in the test suite (one module takes minutes; the whole list takes hours on 2 cores):

    python bench/mutation.py fedzoo/secagg/signatures.py      # one module
    python bench/mutation.py                                  # every module in MODULES
    python bench/mutation.py fedzoo/secagg/client.py --functions _consistency_signers unmask   # some functions
    python bench/mutation.py server/fl/secure_rounds.py --functions equal_weights --tests "tests/x.py::test_y"
    python bench/mutation.py fedzoo/secagg/client.py --mutants "fedzoo.secagg.client.x_f__mutmut_3"   # re-test some

mutmut imports the mutated copy through `sys.path`, but the repository's areas are installed under one namespace
by `package-dir` (`server/` is `fedzoo.server`), which the editable install maps to the original files. So each
run builds the installed layout in a scratch folder (fedzoo/ with every area inside it, tests/ beside it) and runs
mutmut there, against the tests MODULES names for the module, less those marked slow (a survivor runs every
test that reaches the mutated function: one 30 s test costs 30 s per survivor). It prints, per module, the mutants
killed and every survivor with its diff; docs/testing.md lists the survivors that remain and why each is harmless.
The goal: no survivor on a line that refuses, verifies or bounds something.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AREAS = ("cloud", "edge", "nas", "compress", "server", "clients")  # pyproject.toml's package-dir, under fedzoo/
# module (repository path) -> pytest arguments selecting the tests that should notice any change to it: fast ones,
# since a survivor runs all of them
MODULES: dict[str, list[str]] = {
    "fedzoo/secagg/signatures.py": ["tests/secagg/test_vectors.py", "tests/secagg/test_signatures.py"],
    "fedzoo/secagg/client.py": [  # the dropout sweep (100 s) only re-proves exact sums, which faster tests pin too
        "tests/secagg/test_vectors.py", "tests/secagg/test_protocol.py", "tests/secagg/test_device_certificates.py",
        "--deselect=tests/secagg/test_protocol.py::test_the_sum_is_exact_whatever_fraction_drops_at_each_stage"],
    "fedzoo/secagg/server.py": ["tests/secagg/test_protocol.py"],
    "fedzoo/secagg/shamir.py": ["tests/secagg/test_shamir.py", "tests/secagg/test_vectors.py"],
    "fedzoo/secagg/encoding.py": ["tests/secagg/test_encoding.py", "tests/secagg/test_vectors.py"],
    "fedzoo/secagg/framing.py": ["tests/secagg/test_framing.py", "tests/secagg/test_vectors.py"],
    "fedzoo/signing.py": ["tests/clients/test_signed_models.py", "tests/server/test_signed_cards.py"],
    "fedzoo/dp/distributed.py": ["tests/dp/test_distributed.py"],
    "fedzoo/dp/discrete_gaussian.py": ["tests/dp/test_discrete_gaussian.py", "tests/dp/test_distributed.py"],
    "fedzoo/dp/accountant.py": ["tests/dp/test_accountant.py"],
    "fedzoo/dp/noise.py": ["tests/dp/test_noise.py"],
    "fedzoo/dp/clipping.py": ["tests/dp/test_noise.py"],
    "fedzoo/dp/seeded_stream.py": ["tests/dp/test_distributed.py"],
    "fedzoo/aggregation/private.py": [
        "tests/dp/test_noise.py",
        "tests/server/test_fl_robust.py::test_the_unmasked_sum_must_lie_within_what_clipped_updates_add_up_to"],
    "fedzoo/aggregation/weighting.py": [
        "tests/server/test_fl_robust.py::test_a_claimed_example_count_weighs_at_most_k_times_the_rounds_median",
        "tests/server/test_weight_bound.py"],
    "server/fl/root_trust.py": ["tests/server/test_fl_robust.py::test_the_aggregate_check_under_secure_aggregation",
                                "tests/server/test_root_trust.py"],
    "server/fl/secure_rounds.py": ["tests/server/test_fl_secure_rounds.py", "tests/server/test_fl_robust.py"],
    "clients/card_trust.py": ["tests/clients/test_signed_models.py"],
}
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", ".hypothesis", "target", "mutants")


def installed_path(module: str) -> str:
    """Where `module` lies in the installed layout: `server/fl/x.py` is `fedzoo/server/fl/x.py`."""
    area = module.split("/", 1)[0]
    return f"fedzoo/{module}" if area in AREAS else module


def build_layout(scratch: Path, module: str, tests: list[str], timeout_multiplier: float) -> None:
    shutil.copytree(ROOT / "fedzoo", scratch / "fedzoo", ignore=IGNORED)
    for area in AREAS:
        shutil.copytree(ROOT / area, scratch / "fedzoo" / area, ignore=shutil.ignore_patterns(
            "__pycache__", "*.pyc", "java", "mutants"))
    shutil.copytree(ROOT / "tests", scratch / "tests", ignore=IGNORED)
    target = installed_path(module)
    only = f"{target}/*" if (ROOT / module).is_dir() else target
    selection = ", ".join(f'"{test}"' for test in tests)
    (scratch / "pyproject.toml").write_text(f"""[tool.pytest.ini_options]
testpaths = ["tests"]
addopts = "-q -p no:cacheprovider --import-mode=importlib"
markers = ["slow: end-to-end tests"]

[tool.mutmut]
source_paths = ["fedzoo"]
only_mutate = ["{only}"]
pytest_add_cli_args = ["-m", "not slow"]
pytest_add_cli_args_test_selection = [{selection}]
timeout_multiplier = {timeout_multiplier}
""")


def survivors(scratch: Path) -> tuple[dict[str, int], list[str]]:
    """(mutants by status, the names of those no test killed) from `mutmut results --all true`."""
    listing = subprocess.run([sys.executable, "-m", "mutmut", "results", "--all", "true"], cwd=scratch,
                             capture_output=True, text=True, check=True).stdout
    counts: dict[str, int] = {}
    survived = []
    for name, status in re.findall(r"^\s*(\S+): (.+)$", listing, flags=re.MULTILINE):
        counts[status] = counts.get(status, 0) + 1
        if status in ("survived", "no tests"):
            survived.append(name)
    return counts, survived


def mutant_patterns(functions: list[str]) -> list[str]:
    """mutmut's names of the mutants of these functions or methods (`f` is `x_f`, `C.f` is `xǁCǁf`)."""
    return [pattern for name in functions for pattern in (f"*.x_{name}__mutmut_*", f"*ǁ{name}__mutmut_*")]


def run(module: str, max_children: int, functions: list[str], tests: list[str], mutants: list[str],
        timeout_multiplier: float) -> int:
    """Mutates one module (only `functions`, or only `mutants`, when given) against `tests` (default: its MODULES
    selection), prints its counts and the mutants no test killed; returns their number."""
    tests = tests or MODULES[module]
    with tempfile.TemporaryDirectory(prefix="fedzoo-mutation-") as folder:
        scratch = Path(folder)
        build_layout(scratch, module, tests, timeout_multiplier)
        done = subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children),
                               *mutants, *mutant_patterns(functions)], cwd=scratch, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"{module}: mutmut failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
            return -1
        counts, survived = survivors(scratch)
        print(f"{module} (tests: {' '.join(tests)}): " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
        for name in survived:
            diff = subprocess.run([sys.executable, "-m", "mutmut", "show", name], cwd=scratch, capture_output=True,
                                  text=True).stdout
            changed = [line for line in diff.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")]
            print(f"  not killed {name}:\n    " + "\n    ".join(changed))
    return len(survived)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", metavar="module",
                        help=f"repository paths among MODULES (default: all): {', '.join(MODULES)}")
    parser.add_argument("--max-children", type=int, default=1, help="mutants tested at once (default 1)")
    parser.add_argument("--functions", nargs="+", default=[], metavar="name",
                        help="mutate only these functions or methods (a method by its name alone), e.g. where a "
                             "module is too large for one sitting; the others count as 'not checked'")
    parser.add_argument("--tests", nargs="+", default=[], metavar="selection",
                        help="pytest selections replacing MODULES' for the module, e.g. the fast unit tests of the "
                             "functions named by --functions where the module's round tests take minutes a mutant")
    parser.add_argument("--mutants", nargs="+", default=[], metavar="name",
                        help="test only these mutants, by the names an earlier run printed (e.g. its survivors, "
                             "once tests were added); the others count as 'not checked'")
    parser.add_argument("--timeout-multiplier", type=float, default=15.0,
                        help="a mutant is stopped (and counted 'timeout') after this many times its tests' CPU time "
                             "(x 2, plus a constant; mutmut's default 15): lower it where mutants of a sampling loop "
                             "make it never end")
    arguments = parser.parse_args()
    unknown = sorted(set(arguments.modules) - set(MODULES))
    if unknown:
        parser.error(f"no tests are named for {', '.join(unknown)}: add the module to MODULES in bench/mutation.py")
    results = {module: run(module, arguments.max_children, arguments.functions, arguments.tests,
                          arguments.mutants, arguments.timeout_multiplier)
               for module in arguments.modules or MODULES}
    print("not killed per module: " + ", ".join(f"{module} {count}" for module, count in results.items()))


if __name__ == "__main__":
    main()
