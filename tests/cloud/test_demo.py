"""`fedzoo demo`, the README's main job, end to end on the tiny preset: every stage must run."""

import shutil
import subprocess
import sys

import pytest

from fedzoo.zoo import Zoo


@pytest.mark.slow
def test_demo_builds_serves_and_runs_a_client_and_federated_rounds(tmp_path):
    workdir = tmp_path / "demo"
    result = subprocess.run(
        [sys.executable, "-c", "from fedzoo.cli import main; main()", "demo", "--workdir", str(workdir), "--preset", "tiny"],
        capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    output = " ".join(result.stdout.split())
    assert output.count("✓") == 9 and "cards signed with operator key" in output
    assert "federated rounds driven by the server" in output and "round 1: closed" in output
    # round 2 publishes, or the server's evaluation refused an aggregate worse than round 1's model
    assert "round 2: closed" in output or "round 2: failed, 5 updates (the aggregate was not published" in output
    assert "under SecAgg+" in output and "round 1: closed, 5 updates" in output
    if shutil.which("java") and shutil.which("mvn"):
        assert "with it (accepted) and two Python devices (accepted, accepted) closed" in output
    else:
        assert "skipped: the Java device needs a JDK and Maven" in output
    cards = Zoo(workdir / "zoo").cards()
    assert len([card for card in cards if card.parent_id is None]) == 4
    assert any(card.precision == "int8" for card in cards)
    assert all(card.training_graph for card in cards if card.precision == "fp32")
