"""`fedzoo demo`, the README's main job, end to end on the tiny preset: every stage must run."""

import shutil
import subprocess
import sys

import pytest

from fedzoo.cards import is_supernet
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
    assert output.count("✓") == 10 and "cards signed with operator key" in output
    assert "federated rounds driven by the server" in output and "round 1: closed" in output
    # round 2 publishes, or the server's evaluation refused an aggregate worse than round 1's model
    assert "round 2: closed" in output or "round 2: failed, 5 updates (the aggregate was not published" in output
    assert "under SecAgg+" in output and "round 1: closed, 5 updates" in output
    if shutil.which("java") and shutil.which("mvn"):
        assert "(int8: accepted)" in output and "(fp32: accepted)" in output and "with 2 updates" in output
    else:
        assert "skipped: the Java device needs a JDK and Maven" in output
    assert "zoo models got a new version" in output and "subnets" in output
    cards = [card for card in Zoo(workdir / "zoo").cards() if not is_supernet(card)]
    assert len([card for card in cards if card.parent_id is None]) == 4
    assert any(card.precision == "int8" for card in cards)
    assert all(card.training_graph for card in cards if card.precision == "fp32")
