"""docs/python-sdk.md runs as written: its Python blocks, in order, as one program, against the real server on
loopback with a real digits model published to it. The test defines only the names the guide tells a reader to
define (SERVER_URL, ENROLLMENT_TOKEN, and the device's own `images` and `labels`), and points HOME at a
temporary folder so the guide's ~/.cache and ~/.config paths stay out of the user's."""

import re
from pathlib import Path

import pytest

from fedzoo.cloud.simulation import Simulation, prepare_federation
from fedzoo.server.testing import LoopbackServer

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "python-sdk.md"
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
# the guide's FL block takes part in three rounds: a plan of three, one device each, the accuracy gate open
# (what the gate decides is not what this test checks); short polls so the device finds each next round soon
ROUND_PLAN = {"num_rounds": 3, "min_clients": 1, "target_clients": 1, "over_selection": 0.0, "deadline_s": 60,
              "batch_size": 32, "poll_interval_s": 0.1, "max_accuracy_drop": 1.0}


def guide_blocks() -> list[str]:
    return PYTHON_BLOCK.findall(GUIDE.read_text())


@pytest.fixture(scope="module")
def federation():
    return prepare_federation("digits", num_clients=2, hidden_units=16, pretrain_epochs=1, seed=0)


def test_the_guide_has_the_blocks_this_test_runs():
    blocks = guide_blocks()
    assert len(blocks) == 3
    assert "client.register(" in blocks[0] and "ENROLLMENT_TOKEN" in blocks[0]


def test_the_python_sdk_guide_runs_against_a_live_server(federation, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with LoopbackServer(tmp_path / "server") as server, \
            Simulation(federation, server.url, cache_root=tmp_path / "operator") as operator:
        operator.publish_base_model()
        enrollment_token = operator.admin.create_enrollment_token(operator.admin_token)["token"]
        first_round_id = operator.start_plan(ROUND_PLAN)
        device_data = federation.client_data(0)
        program = {"SERVER_URL": server.url, "ENROLLMENT_TOKEN": enrollment_token,
                   "images": device_data.x, "labels": device_data.y}
        printed = []
        for index, block in enumerate(guide_blocks(), start=1):
            exec(compile(block, f"{GUIDE.name} python block {index}", "exec"), program)  # a raise fails the test
            printed.append(capsys.readouterr().out)

    model_id = federation.card.id
    assert printed[0].split()[0] == model_id  # the lookup chose the published model and the block printed it
    assert program["logits"].shape == (8, 10)
    assert printed[1].startswith("no_model_fits ")  # the guide's error block did catch the refusal it shows
    outcomes = [(result.round_id, result.outcome) for result in program["results"]]
    assert outcomes == [(first_round_id + number, "accepted") for number in range(3)]
    assert (tmp_path / "home" / ".config" / "fedzoo" / "device.json").is_file()
