"""`fedzoo demo`, the README's main job: its contract, not one machine's numbers. Every stage reports; each
federated round is closed or failed with the server's reason; at least one round of the plan publishes; a stage
that cannot run ends the demo with one line and a non-zero exit status."""

import os
import re
import shutil
import signal
import subprocess
import sys

import pytest
from click.testing import CliRunner

from fedzoo.cards import is_supernet
from fedzoo.cloud import demo as demo_module
from fedzoo.zoo import Zoo

# "round N: closed, K updates, accuracy A (parent P) -> MODEL" or "round N: failed, K updates (REASON)"
ROUND = re.compile(r"round (\d+): (?:(closed), (\d+) updates, accuracy [\d.]+ \(parent [\d.]+\) -> (\S+)"
                   r"|(failed), (\d+) updates \(([^)]+)\))")


def rounds_in(line: str) -> list[tuple[str, int]]:
    """(state, accepted updates) of every round a stage's summary line reports."""
    return [("closed", int(m[3])) if m[2] else ("failed", int(m[6])) for m in ROUND.finditer(line)]


def check_improved_headline(zoo_round: str) -> None:
    """A zoo-wide round's line states each zoo model's accuracy "before -> after (", and says "every zoo model
    improved" exactly when each one did."""
    changes = [float(after) - float(before) for before, after in re.findall(r"([\d.]+) -> ([\d.]+) \(", zoo_round)]
    assert changes and ("every zoo model improved" in zoo_round) == all(change > 0 for change in changes), zoo_round


def run_in_own_process_group(command: list[str], cwd, timeout_s: float) -> subprocess.CompletedProcess:
    """`subprocess.run` whose timeout ends the whole process group: the server the demo started goes with it
    instead of outliving a failed test."""
    with subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


@pytest.mark.slow
def test_the_demo_from_a_relative_default_workdir_runs_every_stage_and_publishes_a_round(tmp_path):
    # as a newcomer types it: no --workdir, so the default relative one, under the current directory
    has_java = bool(shutil.which("java") and shutil.which("mvn"))
    result = run_in_own_process_group(
        [sys.executable, "-c", "from fedzoo.cli import main; main()", "demo", "--preset", "tiny",
         *([] if has_java else ["--skip-java"])],
        cwd=tmp_path, timeout_s=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "\x1b[" not in result.stderr and "Traceback" not in result.stderr  # no Maven colour codes leak
    output = " ".join(result.stdout.split())
    assert output.count("✓") == len(demo_module.STAGES) and "cards signed with operator key" in output
    federated = output[output.index("▶ federated rounds driven by the server"):output.index("▶ a zoo-wide round")]
    rounds = rounds_in(federated)
    assert len(rounds) == 3 and "under SecAgg+" in federated
    assert ("closed", 5) in rounds  # at least one round of the plan publishes
    java = output[output.index("▶ a Java SDK device"):output.index("▶ a private zoo-wide round")]
    if has_java:  # a private round of the Java device and two Python ones: closed, or failed with its reason
        assert "with it (accepted) and two Python devices (accepted, accepted), SecAgg+ round" in java
        assert rounds_in(java)[0][1] == 3
    else:
        assert "skipped (--skip-java)" in java
    assert "zoo models got a new version" in output and "subnets" in output
    zoo_round = output[output.index("▶ a zoo-wide round"):output.index("▶ a Java SDK device")]
    check_improved_headline(zoo_round)
    private = output[output.index("▶ a private zoo-wide round"):]
    assert re.search(r"private zoo-wide round \d+ closed with (5|6) Python devices", private), private
    assert ("the Java device (accepted)" in private) == has_java
    epsilon = float(re.search(r"every zoo model's line was charged epsilon ([\d.]+) at delta 1e-05", private)[1])
    assert 0 < epsilon <= 8  # the plan's budget
    check_improved_headline(private)
    stated = [float(value) for value in re.findall(r"states epsilon ([\d.]+)", private)]
    assert all(value == pytest.approx(epsilon, abs=0.01) for value in stated)  # a fresh line: this round's epsilon
    assert (len(stated) == 0) == ("the gate kept every parent" in private)
    cards = [card for card in Zoo(tmp_path / ".fedzoo" / "demo" / "zoo").cards() if not is_supernet(card)]
    assert len([card for card in cards if card.parent_id is None]) == 4
    assert any(card.precision == "int8" for card in cards)
    assert all(card.training_graph for card in cards if card.precision == "fp32")
    assert not (tmp_path / "clients").exists()  # nothing lands beside the Maven module's relative base


def _zoo_outcome(changes: list[tuple[float, float]]) -> dict:
    """A zoo round's outcome as the server records it (server/fl/zoo_plan.py), one model per (before, after)."""
    return {"models": [{"model_id": f"m{index}", "accuracy_before": before, "accuracy_after": after,
                        "published": after > before, "new_model_id": f"m{index}-v2"}
                       for index, (before, after) in enumerate(changes)],
            "new_versions": sum(after > before for before, after in changes),
            "devices_per_zoo_model": {"m0": 2, "m1": 2}, "coverage": {"released": 10, "parameters": 20}}


def test_the_zoo_round_headline_says_every_model_improved_only_when_every_one_did():
    fell = demo_module.zoo_round_summary(_zoo_outcome([(0.90, 0.93), (0.97, 0.946), (0.80, 0.85)]))
    assert "every zoo model improved" not in fell
    assert fell.startswith("2 of 3 zoo models improved, 1 fell")
    assert "m1 0.9700 -> 0.9460 (-2.40 points, not published)" in fell  # each model before -> after
    rose = demo_module.zoo_round_summary(_zoo_outcome([(0.90, 0.93), (0.80, 0.85)]))
    assert rose.startswith("every zoo model improved (2 of 2)")
    unchanged = demo_module.zoo_round_summary(_zoo_outcome([(0.90, 0.93), (0.80, 0.80)]))
    assert unchanged.startswith("1 of 2 zoo models improved, 0 fell")
    for summary in (fell, rose, unchanged):  # what the full demo test reads of its two zoo-wide rounds
        check_improved_headline(summary)
    withheld = {name: value for name, value in _zoo_outcome([(0.90, 0.93)]).items()  # a DP round's view
                if name not in ("devices_per_zoo_model", "coverage")}
    assert demo_module.zoo_round_summary(withheld) == (
        "every zoo model improved (1 of 1); 1 of 1 zoo models got a new version: m0 0.9000 -> 0.9300 "
        "(+3.00 points, new version m0-v2)")


def test_every_demo_preset_names_a_built_in_data_set_and_a_build_preset():
    from fedzoo.datasets import BUILTIN_DATASETS
    from fedzoo.cloud.pipeline import PRESETS

    assert demo_module.DEMO_PRESETS["tiny"] == demo_module.DemoPreset("mnist", "tiny", "MNIST-5k")  # CI's run
    for preset in demo_module.DEMO_PRESETS.values():
        assert preset.dataset in BUILTIN_DATASETS and preset.build_preset in PRESETS


def test_a_stage_that_cannot_run_ends_the_demo_with_one_line_and_a_non_zero_status(tmp_path, monkeypatch):
    def offline_build(run):
        raise demo_module.StageError("building the Java SDK with Maven (offline?) failed with exit status 1")

    reached = []
    monkeypatch.setattr(demo_module, "STAGES", [("first", lambda run: reached.append(run.workdir) or "done"),
                                                ("java", offline_build), ("never", lambda run: reached.append(0))])
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(demo_module.demo, ["--workdir", "relative"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.strip().splitlines()[-1] == (
        "Error: stage 'java' could not run: building the Java SDK with Maven (offline?) failed with exit status 1")
    assert reached == [tmp_path / "relative"]  # the workdir was made absolute; no stage ran after the failure


def test_an_unexpected_error_is_one_line_with_its_traceback_in_a_log(tmp_path, monkeypatch):
    monkeypatch.setattr(demo_module, "STAGES", [("broken", lambda run: {}["missing"])])
    result = CliRunner().invoke(demo_module.demo, ["--workdir", str(tmp_path)])
    assert result.exit_code == 1
    assert result.output.strip().splitlines()[-1] == (
        f"Error: stage 'broken' failed: KeyError: 'missing' (traceback: {tmp_path / 'demo-error.log'})")
    assert "Traceback" in (tmp_path / "demo-error.log").read_text()


def test_without_a_jdk_the_java_stage_names_what_is_missing_and_the_way_to_skip_it(tmp_path, monkeypatch):
    monkeypatch.setattr(demo_module.shutil, "which", lambda tool: None if tool == "mvn" else f"/usr/bin/{tool}")
    with pytest.raises(demo_module.StageError, match=r"'mvn' on PATH not found \(install them, or pass --skip-java\)"):
        demo_module._java_sdk_command(demo_module.DemoRun(workdir=tmp_path, preset="tiny"))
    run = demo_module.DemoRun(workdir=tmp_path, preset="tiny", skip_java=True)
    assert demo_module.stage_java_device(run) == "skipped (--skip-java)"
