"""Latency prediction across an emulated device fleet: predictor accuracy and lookup regret.

How accurate the kernel-level predictor is, and how often choosing models by its predicted latency picks
another model than the truly best or misses the budget.

For every device class of `fedzoo.edge.fleet` this machine can emulate, a worker process measures every
zoo model (fp32 and INT8) together with the calibration models, in interleaved rounds at real-time
priority (not for the quota class). Every class is measured in two passes, minutes apart (pass "b" starts
after every class's pass "a"), and judged in each: the predictor for a class and pass is the shipped
reference (fitted on random synthetic models, never on zoo models, in both conv layouts) calibrated *only*
with that pass's calibration-model timings, compared with the reference's own timings of them. The
server's lookup stores the predictor without its similarity correction (group costs times device scales,
`fedzoo.server.latency`): that form is judged beside it.

The noise ceiling: the other pass's timings of the zoo models themselves, rescaled by how much that pass's
calibration models ran faster or slower. This is the best a reference measured at another time can do if
it knew every zoo model exactly: on a machine whose kernels change speed unevenly from run to run (a shared
VM), it is below 100% (87-96% within ±10% in three runs on ours, where two sessions timed in the same rounds
agreed on 96%).

Zoo: /work/main/zoo (or $FEDZOO_ZOO) if it has cards, else MobileNetV2-style subnets of the NAS default
search space built here with torch (random weights, some with pruned widths) and INT8 copies made by the
compression stage's `quantize_int8`; then "accuracy" is synthetic (grows with MACs, plus noise).

Online recalibration and device-confirmed lookup (issue 25), judged on the same timings with the server's
own code (`fedzoo.server.online_calibration`, the shortlist rule of `fedzoo.server.lookup`), for the
server's form of the predictor: each class and pass is a fresh device whose telemetry reports are the *other*
pass's medians of the reported models (a report measured at another time), judged against this pass's.
- share within ±10% of the models not reported, after 0, 1 and 3 reports (random models, several draws);
- first-lookup regret, predictor-only against device-confirmed: the device asks for the shortlist, "times"
  each shortlisted model (its other-pass median), keeps the first that fits, reports every timing, and asks
  again when none fits (`fedzoo.clients.confirmation`). Its extra seconds per lookup are estimated from the
  policy's runs x the timed medians plus a session setup each, not measured.
Both twice, side by side: with no fleet telemetry, and with the models' fleet latency factors learned from
the *other* classes' devices (each one a device that reported every model in the other pass; the server's
`model_factor`): a device of a class the fleet has never seen, whose models other devices have run.

Run: .venv/bin/python bench/latency_fleet.py [--timings timings.json] [--reference candidate.json ...]
[--rounds N] [--judge-timings timings.json] (--timings gets every class's medians per pass; each --reference is
a refitted reference predictor judged on the same timings as the shipped one, side by side; --rounds fewer
interleaved rounds than the default 300, for a shorter run on a shared machine, at the price of noisier
medians; --judge-timings judges the medians of an earlier run of the same zoo again, measuring nothing)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from fedzoo.clients.confirmation import SESSION_SETUP_S, ConfirmationPolicy
from fedzoo.edge.calibration_models import calibration_models
from fedzoo.edge.fleet import DeviceClass, available_fleet, run_on_device_class
from fedzoo.edge.latency_predictor import CALIBRATION_GROUPS, REFERENCE_MODEL_PATH, KernelLatencyPredictor, kernel_features
from fedzoo.server.lookup import SHORTLIST_SIGMAS
from fedzoo.server.tables import LATENCY_SLOTS
from fedzoo.server.online_calibration import (
    MEASURED_LOG_SIGMA, CalibrationState, kalman_update, model_factor, relative_residuals,
)

# 300 rounds, not 30: with 30, this VM's speed spells moved two sessions of the same model apart by up to 28%
# (re-measurement within ±10%: 54-89% per class); with 300 they repeated within ±10% for 96-100% of the zoo
# on the classes without a quota. The quota class repeated 56-83% with 10 rounds, 88% with 30 (one run).
ROUNDS, RUNS_PER_ROUND = 300, 2
QUOTA_ROUNDS, QUOTA_RUNS_PER_ROUND = 30, 1
BUDGET_DRAWS = 2000
GENERATED_ARCHITECTURES = 28
PASSES = ("a", "b")
TELEMETRY_REPORTS = (0, 1, 3)
FLEET = ("", "_fleet")  # the online figures without fleet telemetry, and with the other classes' model factors
ONLINE_KEYS = tuple(f"{key}{fleet}" for fleet in FLEET for key in (
    "differ_server", "miss_server", "differ_confirmed", "miss_confirmed", "confirm_s",
    *(f"within_after_{count}" for count in TELEMETRY_REPORTS)))
REGRET_KEYS = ("differ", "miss", "differ_margin", "miss_margin", "differ_ceiling", "miss_ceiling", *ONLINE_KEYS)
TELEMETRY_DRAWS = 20  # random choices of the reported models per class and pass


def zoo_models(folder: Path) -> tuple[dict[str, bytes], dict[str, float], dict[str, str], str]:
    """{name: onnx bytes}, {name: accuracy}, {name: precision} and where they came from."""
    zoo_root = Path(os.environ.get("FEDZOO_ZOO", Path(__file__).resolve().parents[1] / "zoo"))
    if (zoo_root / "zoo.json").exists():
        from fedzoo.zoo import Zoo

        zoo = Zoo(zoo_root)
        cards = zoo.cards()
        if cards:
            models = {card.id: zoo.model_path(card).read_bytes() for card in cards}
            accuracy = {card.id: card.metrics.accuracy for card in cards}
            precision = {card.id: card.precision for card in cards}
            return models, accuracy, precision, f"zoo {zoo_root} ({len(cards)} cards, card accuracies)"
    return generated_models(folder)


def generated_models(folder: Path) -> tuple[dict[str, bytes], dict[str, float], dict[str, str], str]:
    import torch

    from fedzoo.compress.quantize import quantize_int8
    from fedzoo.nas.export import export_onnx
    from fedzoo.nas.space import default_space
    from fedzoo.nas.subnet import build_subnet, count_macs

    torch.set_num_threads(1)
    logging.disable(logging.WARNING)
    space = default_space(28)
    rng = np.random.default_rng(2026)
    models: dict[str, bytes] = {}
    macs: dict[str, int] = {}
    calibration_images = rng.standard_normal((64, 1, 28, 28)).astype(np.float32)
    for index in range(GENERATED_ARCHITECTURES):
        arch = space.sample_arch(rng)
        if index % 3 == 2:  # pruned widths: arbitrary channel counts, as structured pruning leaves them
            keep = float(rng.uniform(0.5, 0.9))
            arch["stem_channels"] = max(4, int(arch["stem_channels"] * keep))
            arch["head_channels"] = max(8, int(arch["head_channels"] * keep))
            for stage in arch["stages"]:
                stage["out_channels"] = max(4, int(stage["out_channels"] * keep))
        torch.manual_seed(index)
        model = build_subnet(arch, 10, 1)
        name = f"mbv2-{index:02d}"
        fp32_path, int8_path = folder / f"{name}.onnx", folder / f"{name}-int8.onnx"
        export_onnx(model, (1, 1, 28, 28), fp32_path)
        quantize_int8(fp32_path, int8_path, calibration_images)
        macs[name] = count_macs(model, (1, 1, 28, 28))
        models[f"{name}-fp32"] = fp32_path.read_bytes()
        models[f"{name}-int8"] = int8_path.read_bytes()
    # Synthetic accuracy: larger models are better on average, INT8 loses a little; noise breaks ties.
    order = {name: rank for rank, name in enumerate(sorted(macs, key=macs.get))}
    accuracy = {}
    for name in models:
        base, _, precision = name.rpartition("-")
        accuracy[name] = 0.90 + 0.08 * order[base] / len(order) + float(rng.normal(0, 0.005)) - (
            0.004 if precision == "int8" else 0.0
        )
    precision = {name: name.rpartition("-")[2] for name in models}
    return models, accuracy, precision, f"generated: {GENERATED_ARCHITECTURES} NAS default-space subnets x (fp32, INT8)"


def accuracy_figures(predicted: np.ndarray, measured: np.ndarray) -> str:
    errors = predicted / measured - 1.0
    return (
        f"within10%={np.mean(np.abs(errors) <= 0.10):6.1%}  within20%={np.mean(np.abs(errors) <= 0.20):6.1%}  "
        f"median|err|={np.median(np.abs(errors)):6.1%}  bias={np.median(errors):+6.1%}"
    )


def within_10_percent(estimate: np.ndarray, measured: np.ndarray) -> np.ndarray:
    return np.abs(estimate / measured - 1.0) <= 0.10


def choose(latency_ms: np.ndarray, accuracy: np.ndarray, names: list[str], budget_ms: float) -> int | None:
    """The server's lookup rule (`fedzoo.server.lookup.BEST_TWO`): of the models whose latency fits the
    budget, the most accurate; ties go to the faster, then to the smaller id. None if nothing fits."""
    fitting = np.flatnonzero(latency_ms <= budget_ms)
    if fitting.size == 0:
        return None
    return int(min(fitting, key=lambda index: (-accuracy[index], latency_ms[index], names[index])))


def lookup_regret(
    estimate_ms: np.ndarray, measured_ms: np.ndarray, accuracy: np.ndarray, names: list[str],
    rng: np.random.Generator, margin: float = 0.0,
) -> tuple[float, float, float, int]:
    """Over log-uniform budgets: share where the model chosen by `estimate_ms` differs from the truly best
    (chosen by the measured medians), share where it misses its budget, mean accuracy lost. `margin` picks
    only models estimated to fit with that much room (a safety margin trades misses for a worse choice)."""
    budgets = np.exp(rng.uniform(np.log(measured_ms.min()), np.log(measured_ms.max() * 1.2), BUDGET_DRAWS))
    differ = miss = 0
    accuracy_lost = 0.0
    for budget in budgets:
        best = choose(measured_ms, accuracy, names, budget)
        assert best is not None  # the budgets start at the fastest measured model
        chosen = choose(estimate_ms * (1.0 + margin), accuracy, names, budget)
        if chosen is None:  # the estimate finds nothing though something fits
            differ += 1
            accuracy_lost += accuracy[best]
            continue
        differ += chosen != best
        miss += measured_ms[chosen] > budget
        accuracy_lost += max(0.0, accuracy[best] - accuracy[chosen])
    return differ / len(budgets), miss / len(budgets), accuracy_lost / len(budgets), len(budgets)


class OnlineDevice:
    """A freshly registered device as the server sees it: calibrated scales refined by its telemetry
    (`fedzoo.server.online_calibration`), and the medians it reported."""

    def __init__(self, reference_costs_ms: np.ndarray, scales: np.ndarray) -> None:
        self.costs = np.pad(reference_costs_ms, ((0, 0), (0, LATENCY_SLOTS - reference_costs_ms.shape[1])))
        self.scales = np.pad(scales, (0, LATENCY_SLOTS - scales.size), constant_values=1.0)
        self.state = CalibrationState.initial(tuple(self.scales), len(CALIBRATION_GROUPS))
        self.reported_ms: dict[int, float] = {}

    def report(self, index: int, median_ms: float) -> None:
        if index not in self.reported_ms:  # as the server: only a model's first report recalibrates
            self.scales = kalman_update(self.state, self.scales, self.costs[index], median_ms)
        self.reported_ms[index] = median_ms

    def latency_ms(self) -> tuple[np.ndarray, np.ndarray]:
        """The lookup's latency of every model and its log sigma (measured medians first)."""
        latency = self.costs @ self.scales
        sigma = np.full(latency.size, self.state.predicted_log_sigma())
        for index, median_ms in self.reported_ms.items():
            latency[index], sigma[index] = median_ms, MEASURED_LOG_SIGMA
        return latency, sigma


def reference_costs(reference: KernelLatencyPredictor, features: list) -> np.ndarray:
    """Each model's reference cost per calibration group (what the server stores at publish time)."""
    return np.array([[reference._reference_group_costs_ms(f)[g] for g in CALIBRATION_GROUPS] for f in features])


def calibrate(
    reference: KernelLatencyPredictor, zoo_features: dict, calibration_features: dict, calibration_names: list[str],
    calibration_ms: np.ndarray,
) -> tuple[KernelLatencyPredictor, np.ndarray, np.ndarray]:
    """The reference calibrated with one pass's calibration timings, and the server's form of it: every zoo
    model's group costs (in the layout calibration found) and the device's registration scales."""
    predictor = reference.calibrated_from_features(
        calibration_features[False], list(calibration_ms), calibration_features[True], calibration_names
    )
    costs = reference_costs(reference, zoo_features[predictor.all_plain_layout])
    return predictor, costs, np.array([predictor.group_scales[g] for g in CALIBRATION_GROUPS])


def fleet_model_factors(device_residuals: list[np.ndarray]) -> np.ndarray:
    """Every model's fleet latency factor (1 where the server has none) when each of these devices reported
    every model with these log residuals against its registration scales (`online_calibration`'s rule)."""
    factors = [model_factor(relative_residuals((float(residuals[index]), float(np.mean(residuals)), residuals.size)
                                               for residuals in device_residuals))
               for index in range(device_residuals[0].size)]
    return np.array([1.0 if factor is None else factor for factor in factors])


def within_after_reports(costs: np.ndarray, scales: np.ndarray, reported_ms: np.ndarray, measured: np.ndarray,
                         rng: np.random.Generator) -> dict[int, float]:
    """Share within ±10% of the models not reported, after each count of TELEMETRY_REPORTS random reports."""
    shares: dict[int, list[float]] = {count: [] for count in TELEMETRY_REPORTS}
    for _ in range(TELEMETRY_DRAWS):
        order = rng.permutation(measured.size)
        held_out = order[max(TELEMETRY_REPORTS):]
        device = OnlineDevice(costs, scales)
        for count in TELEMETRY_REPORTS:
            for index in order[len(device.reported_ms):count]:
                device.report(int(index), float(reported_ms[index]))
            latency, _ = device.latency_ms()
            shares[count].append(float(np.mean(within_10_percent(latency[held_out], measured[held_out]))))
    return {count: float(np.mean(values)) for count, values in shares.items()}


def confirmed_lookup_regret(
    costs: np.ndarray, scales: np.ndarray, timed_ms: np.ndarray, measured_ms: np.ndarray, accuracy: np.ndarray,
    names: list[str], rng: np.random.Generator, policy: ConfirmationPolicy = ConfirmationPolicy(),
) -> tuple[float, float, float]:
    """Over the same log-uniform budgets as `lookup_regret`, a fresh device's first lookup confirmed on the
    device (module docstring): shares that differ from the truly best and that miss the budget, and the
    mean estimated seconds confirmation spent timing."""
    budgets = np.exp(rng.uniform(np.log(measured_ms.min()), np.log(measured_ms.max() * 1.2), BUDGET_DRAWS))
    differ = miss = 0
    seconds = 0.0
    for budget in budgets:
        best = choose(measured_ms, accuracy, names, budget)
        device = OnlineDevice(costs, scales)
        chosen = choice = None
        for _ in range(policy.max_lookups):
            latency, sigma = device.latency_ms()
            choice = choose(latency, accuracy, names, budget)
            if choice is None:  # the server finds nothing that fits (409)
                break
            for index in shortlist(latency, sigma, accuracy, names, budget, choice, policy.max_models):
                if index not in device.reported_ms:
                    seconds += SESSION_SETUP_S + (policy.warmup_runs + policy.timed_runs) * timed_ms[index] / 1000
                    device.report(index, float(timed_ms[index]))
                if device.reported_ms[index] <= budget:
                    chosen = index
                    break
            if chosen is not None:
                break
        if chosen is None:  # confirmation ran out of lookups: the server's last choice, unconfirmed
            chosen = choice
        differ += chosen != best
        miss += chosen is not None and measured_ms[chosen] > budget
    return differ / len(budgets), miss / len(budgets), seconds / len(budgets)


def shortlist(latency: np.ndarray, sigma: np.ndarray, accuracy: np.ndarray, names: list[str], budget: float,
              choice: int, max_models: int) -> list[int]:
    """`fedzoo.server.lookup`'s shortlist: the models ranked above the choice whose latency is within
    exp(SHORTLIST_SIGMAS sigma) of the budget, then the choice."""
    rank = lambda index: (-accuracy[index], latency[index], names[index])  # noqa: E731
    above = sorted((index for index in np.flatnonzero(latency <= budget * np.exp(SHORTLIST_SIGMAS * sigma))
                    if rank(index) < rank(choice)), key=rank)
    return [int(index) for index in above[:max_models - 1]] + [choice]


def measure_class(device_class: DeviceClass, models: dict[str, bytes], calibration: dict[str, bytes],
                  rounds: int) -> dict:
    """Every zoo and calibration model ("zoo:name", "cal:name") measured in the same interleaved rounds."""
    everything = {f"{kind}:{name}": source[name] for kind, source in (("zoo", models), ("cal", calibration)) for name in source}
    # A quota class's samples each average runs over QUOTA_SAMPLE_PERIODS quota periods: fewer are needed.
    rounds, runs = (min(QUOTA_ROUNDS, rounds), QUOTA_RUNS_PER_ROUND) if device_class.cpu_quota else (rounds, RUNS_PER_ROUND)
    return run_on_device_class(device_class, everything, rounds, runs, realtime=True, timeout_s=3600.0)


def another_run_estimate(other_zoo_ms: np.ndarray, other_calibration_ms: np.ndarray, calibration_ms: np.ndarray) -> np.ndarray:
    """The noise ceiling's estimate: another run's zoo timings times the geometric-mean ratio of this run's
    calibration timings to that run's (a perfect reference, measured at another time, then calibrated)."""
    return other_zoo_ms * float(np.exp(np.mean(np.log(calibration_ms / other_calibration_ms))))


def judge(
    label: str, calibrated: tuple[KernelLatencyPredictor, np.ndarray, np.ndarray], zoo_features: dict,
    measured: np.ndarray, ceiling: np.ndarray, other_measured: np.ndarray, fleet_factors: np.ndarray,
    accuracy: np.ndarray, precision: np.ndarray, names: list[str], class_index: int,
) -> tuple[dict, np.ndarray]:
    """Print how a reference `calibrated` with one pass's calibration timings (`calibrate`) predicts that
    pass's zoo timings beside the noise ceiling's estimate `ceiling`, and return its summary row and
    predictions. `fleet_factors`: the models' fleet latency factors from the other classes' telemetry."""
    rng = np.random.default_rng(class_index)
    predictor, costs, scales = calibrated
    layout_features = zoo_features[predictor.all_plain_layout]
    predicted = np.array([predictor.predict_from_features(f) for f in layout_features])
    server_form = costs @ scales
    scale_text = ", ".join(f"{g}={s:.2f}" for g, s in predictor.group_scales.items())
    print(f"    reference {label}: calibration scales {scale_text}; fp32 convs all in plain NCHW: {predictor.all_plain_layout}")
    for kind in ("fp32", "int8"):
        mask = precision == kind
        print(f"      calibrated predictor ({kind})   {accuracy_figures(predicted[mask], measured[mask])}")
        print(f"      server's form, scales only ({kind}) {accuracy_figures(server_form[mask], measured[mask])}")
    differ, miss, lost, draws = lookup_regret(predicted, measured, accuracy, names, rng)
    differ_margin, miss_margin, lost_margin, _ = lookup_regret(predicted, measured, accuracy, names, rng, 0.10)
    differ_ceiling, miss_ceiling, _, _ = lookup_regret(ceiling, measured, accuracy, names, rng)
    print(f"      lookup over {draws} budgets: predicted-best != truly-best {differ:6.1%}, chosen misses budget "
          f"{miss:6.1%}, mean accuracy lost {lost * 100:.3f} pt; with a 10% safety margin: differs "
          f"{differ_margin:6.1%}, misses {miss_margin:6.1%}, accuracy lost {lost_margin * 100:.3f} pt")
    row = {
        "within": within_10_percent(predicted, measured), "precision": precision,
        "ceiling": within_10_percent(ceiling, measured), "differ": differ, "miss": miss,
        "differ_margin": differ_margin, "miss_margin": miss_margin,
        "within_server": within_10_percent(server_form, measured),
        "within_server_fleet": within_10_percent(server_form * fleet_factors, measured),
        "differ_ceiling": differ_ceiling, "miss_ceiling": miss_ceiling,
    }
    for fleet, factors in zip(FLEET, (np.ones_like(fleet_factors), fleet_factors)):
        # each side gets the same draws: they differ only by the factors
        rng = np.random.default_rng(class_index)
        differ_server, miss_server, _, _ = lookup_regret(costs @ scales * factors, measured, accuracy, names, rng)
        after_reports = within_after_reports(costs * factors[:, None], scales, other_measured, measured, rng)
        differ_confirmed, miss_confirmed, confirm_s = confirmed_lookup_regret(
            costs * factors[:, None], scales, other_measured, measured, accuracy, names, rng)
        print(f"      server's form{' with fleet factors' if fleet else ''} within ±10% after " + ", ".join(
            f"{count} reports {share:6.1%}" for count, share in after_reports.items())
            + f"; first lookup predictor-only: differs {differ_server:6.1%}, misses {miss_server:6.1%}; "
              f"device-confirmed: differs {differ_confirmed:6.1%}, misses {miss_confirmed:6.1%}, "
              f"~{confirm_s:.3f} s timing per lookup")
        row.update({f"differ_server{fleet}": differ_server, f"miss_server{fleet}": miss_server,
                    f"differ_confirmed{fleet}": differ_confirmed, f"miss_confirmed{fleet}": miss_confirmed,
                    f"confirm_s{fleet}": confirm_s,
                    **{f"within_after_{count}{fleet}": share for count, share in after_reports.items()}})
    return row, predicted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timings", type=Path, help="write every class's medians per pass to this JSON file")
    parser.add_argument("--reference", type=Path, action="append", default=[],
                        help="a refitted reference predictor to judge beside the shipped one (repeatable)")
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help=f"interleaved timing rounds per class and pass (default {ROUNDS}; fewer: noisier)")
    parser.add_argument("--judge-timings", type=Path,
                        help="judge the medians an earlier run wrote with --timings (same zoo) instead of measuring")
    arguments = parser.parse_args()
    start = time.time()
    saved_timings = json.loads(arguments.judge_timings.read_text()) if arguments.judge_timings else None
    fleet, dropped = available_fleet()
    if saved_timings is not None:
        dropped += [f"{c.name}: not in {arguments.judge_timings}" for c in fleet if c.name not in saved_timings]
        fleet = [c for c in fleet if c.name in saved_timings]
    with tempfile.TemporaryDirectory() as folder:
        models, accuracy_by_name, precision_by_name, source = zoo_models(Path(folder))
    calibration = calibration_models()
    print(f"zoo: {source}; {len(models)} models; calibration models: {len(calibration)}")
    print(f"device classes: {', '.join(c.name for c in fleet)}; each measured in passes {', '.join(PASSES)}")
    for reason in dropped:
        print(f"  not emulated: {reason}")
    references = {"shipped": KernelLatencyPredictor.load(REFERENCE_MODEL_PATH)}
    references.update({str(path): KernelLatencyPredictor.load(path) for path in arguments.reference})
    for label, reference in references.items():
        print(f"reference {label}: fitted on {reference.reference_device}, overhead {reference.overhead_ms * 1000:.1f} us")
    names = list(models)
    zoo_features = {plain: [kernel_features(models[n], plain) for n in names] for plain in (False, True)}
    calibration_features = {plain: [kernel_features(calibration[n], plain) for n in calibration] for plain in (False, True)}
    accuracy = np.array([accuracy_by_name[name] for name in names])
    precision = np.array([precision_by_name[name] for name in names])
    zoo_ms: dict[tuple[str, str], np.ndarray] = {}
    calibration_ms: dict[tuple[str, str], np.ndarray] = {}
    if saved_timings is not None:
        if any(saved_timings[c.name]["models"] != names for c in fleet):
            sys.exit(f"{arguments.judge_timings} has other zoo models than {source}")
        for device_class in fleet:
            for pass_name in PASSES:
                timings = saved_timings[device_class.name][pass_name]
                zoo_ms[device_class.name, pass_name] = np.array(timings["measured_ms"])
                calibration_ms[device_class.name, pass_name] = np.array(
                    [timings["calibration_ms"][name] for name in calibration])
    else:
        for pass_name in PASSES:
            for device_class in fleet:
                class_start = time.time()
                timings = measure_class(device_class, models, calibration, arguments.rounds)
                key = (device_class.name, pass_name)
                zoo_ms[key] = np.array([timings[f"zoo:{n}"].median_ms for n in names])
                calibration_ms[key] = np.array([timings[f"cal:{n}"].median_ms for n in calibration])
                print(f"[{device_class.name} pass {pass_name}] threads={device_class.threads} cpus={device_class.cpus} "
                      f"quota={device_class.cpu_quota} graph_optimization={device_class.graph_optimization} "
                      f"({time.time() - class_start:.0f} s): zoo medians {zoo_ms[key].min():.3f}..{zoo_ms[key].max():.3f} ms, "
                      f"p90/median {np.median([timings[f'zoo:{n}'].p90_ms / timings[f'zoo:{n}'].median_ms for n in names]):.2f}, "
                      f"runs per sample {min(timings[f'zoo:{n}'].runs_per_sample for n in names)}.."
                      f"{max(timings[f'zoo:{n}'].runs_per_sample for n in names)}")
    # Every reference calibrated with every class's and pass's timings; each class and pass is also a device
    # that reported every zoo model: its log residuals against its registration scales make the other
    # classes' fleet factors.
    calibrated: dict[tuple[str, str, str], tuple[KernelLatencyPredictor, np.ndarray, np.ndarray]] = {}
    residuals: dict[tuple[str, str, str], np.ndarray] = {}
    for label, reference in references.items():
        for key in zoo_ms:
            calibrated[(label, *key)] = calibrate(reference, zoo_features, calibration_features, list(calibration),
                                                  calibration_ms[key])
            _, costs, scales = calibrated[(label, *key)]
            residuals[(label, *key)] = np.log(zoo_ms[key] / (costs @ scales))
    rows: dict[str, list[dict]] = {label: [] for label in references}
    saved: dict[str, dict] = {}
    for class_index, device_class in enumerate(fleet):
        print(f"\n[{device_class.name}]")
        saved[device_class.name] = {"models": names, "accuracy": accuracy.tolist(), "precision": precision.tolist()}
        for pass_name, other_pass in zip(PASSES, reversed(PASSES)):
            key, other = (device_class.name, pass_name), (device_class.name, other_pass)
            measured = zoo_ms[key]
            ceiling = another_run_estimate(zoo_ms[other], calibration_ms[other], calibration_ms[key])
            print(f"  pass {pass_name}: pass {other_pass}'s zoo timings, calibrated   {accuracy_figures(ceiling, measured)}")
            predictions = {}
            for label in references:
                fleet_factors = fleet_model_factors(
                    [residuals[label, c.name, other_pass] for c in fleet if c.name != device_class.name])
                print(f"    reference {label}: fleet factors from the other classes' pass {other_pass}: "
                      f"{fleet_factors.min():.3f}..{fleet_factors.max():.3f}")
                # the same budget draws for every reference and pass, so their regrets differ only by their estimates
                row, predictions[label] = judge(
                    label, calibrated[(label, *key)], zoo_features, measured, ceiling, zoo_ms[other], fleet_factors,
                    accuracy, precision, names, class_index,
                )
                rows[label].append({"class": device_class.name, **row})
            saved[device_class.name][pass_name] = {
                "measured_ms": measured.tolist(),
                "predicted_ms": {label: values.tolist() for label, values in predictions.items()},
                "calibration_ms": dict(zip(calibration, calibration_ms[key].tolist())),
            }
    for label, label_rows in rows.items():
        print(f"\n===== reference {label}")
        print_summary(label_rows)
    if arguments.timings is not None:
        arguments.timings.write_text(json.dumps(saved, indent=1))
    print(f"bench time {time.time() - start:.0f} s")


def print_summary(rows: list[dict]) -> None:
    """Per class (both passes together) and over all classes: shares within ±10% (fp32, INT8, the noise
    ceiling) and lookup regret, for the predictor, with a 10% margin, and for the noise ceiling's estimate."""
    print("\nper class, both passes (within ±10% of the measured median; lookup regret; with a 10% margin; "
          "by the other pass's calibrated timings):")
    print(f"{'class':<24} {'fp32 ±10%':>9} {'int8 ±10%':>9} {'ceiling':>8} {'differs':>8} {'misses':>7} "
          f"{'+10% differs':>12} {'+10% misses':>11} {'ceiling differs/misses':>23}")
    for name in dict.fromkeys(row["class"] for row in rows):
        mine = [row for row in rows if row["class"] == name]
        within = np.concatenate([row["within"] for row in mine])
        kinds = np.concatenate([row["precision"] for row in mine])
        mean = {key: np.mean([row[key] for row in mine]) for key in REGRET_KEYS}
        print(f"{name:<24} {np.mean(within[kinds == 'fp32']):9.1%} {np.mean(within[kinds == 'int8']):9.1%} "
              f"{np.mean(np.concatenate([row['ceiling'] for row in mine])):8.1%} {mean['differ']:8.1%} {mean['miss']:7.1%} "
              f"{mean['differ_margin']:12.1%} {mean['miss_margin']:11.1%} "
              f"{mean['differ_ceiling']:12.1%}/{mean['miss_ceiling']:.1%}")
    within = np.concatenate([row["within"] for row in rows])
    ceiling = np.concatenate([row["ceiling"] for row in rows])
    mean = {key: np.mean([row[key] for row in rows]) for key in REGRET_KEYS}
    print("\nover all classes and passes:")
    print(f"  predictions within ±10% of measured median: {np.mean(within):.1%} (goal >= 95%)")
    print(f"  the other pass's zoo timings, calibrated, within ±10% (the noise ceiling): {np.mean(ceiling):.1%}")
    print(f"  the server's form (scales only, no similarity correction) within ±10%: "
          f"{np.mean(np.concatenate([row['within_server'] for row in rows])):.1%}; lookup differs "
          f"{mean['differ_server']:.1%}, misses {mean['miss_server']:.1%}; with the other classes' fleet factors "
          f"{np.mean(np.concatenate([row['within_server_fleet'] for row in rows])):.1%}")
    print(f"  lookup: predicted-best differs {mean['differ']:.1%} (goal <= 5%), misses budget {mean['miss']:.1%} "
          f"(goal <= 2%); with a 10% margin differs {mean['differ_margin']:.1%}, misses {mean['miss_margin']:.1%}")
    print(f"  lookup by the other pass's calibrated timings (the noise ceiling of regret): differs "
          f"{mean['differ_ceiling']:.1%}, misses budget {mean['miss_ceiling']:.1%}")
    for fleet, wording in zip(FLEET, ("no fleet telemetry", "fleet factors from the other classes")):
        print(f"  {wording}:")
        print("    online recalibration (server's form, models not reported) within ±10% after "
              + ", ".join(f"{count} reports {mean[f'within_after_{count}{fleet}']:.1%}" for count in TELEMETRY_REPORTS)
              + " (goal >= 95% after 3)")
        print(f"    first lookup, predictor-only (server's form): differs {mean[f'differ_server{fleet}']:.1%}, misses "
              f"{mean[f'miss_server{fleet}']:.1%}; device-confirmed: differs {mean[f'differ_confirmed{fleet}']:.1%} "
              f"(goal <= 3%), misses {mean[f'miss_confirmed{fleet}']:.1%} (goal <= 1%), "
              f"~{mean[f'confirm_s{fleet}']:.3f} s timing per lookup (goal <= 2 s)")


if __name__ == "__main__":
    sys.exit(main())
