"""`fedzoo fl simulate` through the real CLI: a zoo model fine-tuned by virtual devices against the real
server, a JSON summary on stdout, and bad input answered with a message."""

import json

import pytest

from fedzoo.cli import main
from fedzoo.cloud.simulation import prepare_federation
from fedzoo.zoo import Zoo


@pytest.fixture(scope="module")
def zoo_dir(tmp_path_factory):
    """A zoo holding one small digits model with its training graph."""
    federation = prepare_federation("digits", num_clients=1, hidden_units=16, pretrain_epochs=3, seed=0)
    zoo = Zoo.create(tmp_path_factory.mktemp("zoo"))
    for blob in federation.blobs.values():
        zoo.add_blob_bytes(blob)
    zoo.add_card(federation.card)
    return zoo.root, federation.card.id


def run_main(argv, capsys):
    code = 0
    try:
        main(argv)
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["wsgi", "tcp"])
def test_simulate_runs_the_rounds_and_prints_a_json_summary(zoo_dir, capsys, transport):
    folder, model_id = zoo_dir
    code, stdout, stderr = run_main(["fl", "simulate", "--zoo", str(folder), "--model", model_id, "--clients", "12",
                                     "--per-round", "6", "--rounds", "2", "--executor", "in-process", "--http-threads", "2",
                                     "--transport", transport, "--quiet"], capsys)
    assert code == 0, stderr
    summary = json.loads(stdout)
    assert summary["clients"] == 12 and summary["per_round"] == 6 and summary["workers"] == 1
    assert [r["state"] for r in summary["rounds"]] == ["closed", "closed"]
    for record in summary["rounds"]:
        # the server seats exactly the round's 6, even with check-ins from 2 threads
        assert (record["accepted_updates"], record["participants"], record["refused"]) == (6, 6, 0)
        assert 0 < record["train_seconds"] < record["wall_seconds"] and 0 < record["accuracy"] <= 1
        assert record["check_in_seconds"] + record["work_seconds"] <= record["wall_seconds"]
    assert summary["rounds"][1]["result_model_id"] != summary["rounds"][0]["result_model_id"]
    assert summary["peak_rss_mb"] > 0 and summary["worker_peak_rss_mb"] == []  # in-process: no device processes
    assert summary["transport"] == transport and ("WSGI" if transport == "wsgi" else "loopback TCP") in summary["server"]


@pytest.mark.parametrize("arguments, option", [
    (["--transport", "udp"], "--transport"),  # an unknown transport
    (["--clients", "4", "--per-round", "5"], "--per-round"),  # more devices a round than clients
    (["--engine", "ray", "--executor", "processes"], "--executor"),  # the ray engine trains on Ray only
    (["--per-round", "5", "--min-clients", "6", "--engine", "inprocess"], "--min-clients"),  # a minimum above them
])
def test_bad_options_are_refused_with_the_option_named(zoo_dir, capsys, arguments, option):
    folder, model_id = zoo_dir
    code, stdout, stderr = run_main(["fl", "simulate", "--zoo", str(folder), "--model", model_id, *arguments], capsys)
    assert code == 2 and stdout == "" and option in stderr and "Traceback" not in stderr


def test_an_unknown_model_is_a_message_not_a_traceback(zoo_dir, capsys):
    folder, _ = zoo_dir
    code, stdout, stderr = run_main(["fl", "simulate", "--zoo", str(folder), "--model", "no-such-model"], capsys)
    assert code != 0 and stdout == "" and "no-such-model" in stderr and "Traceback" not in stderr


def test_simulate_on_the_inprocess_engine_runs_the_same_plan_without_a_server(zoo_dir, capsys):
    folder, model_id = zoo_dir
    code, stdout, stderr = run_main(["fl", "simulate", "--zoo", str(folder), "--model", model_id, "--clients", "12",
                                     "--per-round", "6", "--rounds", "2", "--engine", "inprocess", "--quiet"], capsys)
    assert code == 0, stderr
    summary = json.loads(stdout)
    assert (summary["engine"], summary["executor"], summary["transport"]) == ("inprocess", "in-process", None)
    for record in summary["rounds"]:
        assert (record["state"], record["accepted_updates"], record["participants"]) == ("closed", 6, 6)
        assert 0 < record["train_seconds"] < record["wall_seconds"] and 0 < record["accuracy"] <= 1
