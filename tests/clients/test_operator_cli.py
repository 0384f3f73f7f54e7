"""`fedzoo models | fl | completion` against a real server on loopback: JSON output parsed back and compared
with the REST API, tables, pages and filters, watching rounds to their end, and errors without tracebacks."""

import json
import os
import subprocess
import sys
import threading

import click
import httpx
import pytest
from click.testing import CliRunner

from fedzoo.cli import cli, main
from fedzoo.cloud.simulation import Simulation, prepare_federation
from fedzoo.server.testing import LoopbackServer

# the accuracy gate is open (max_accuracy_drop 1.0): these tests are about the operator's view of rounds, and
# whether a round's aggregate clears a gate depends on the CPU's numerics
ROUND = {"min_clients": 1, "target_clients": 3, "deadline_s": 60, "batch_size": 16, "max_accuracy_drop": 1.0}
VIEWER_TOKEN = "operator-cli-viewer-token-0123456789"
VIEWER = {"FEDZOO_VIEWER_TOKEN": VIEWER_TOKEN}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """A server holding the base model and the two FL versions of a closed two-round plan."""
    federation = prepare_federation("digits", num_clients=3, alpha=1.0, hidden_units=16, pretrain_epochs=1, seed=2)
    root = tmp_path_factory.mktemp("operator")
    # the tests below send wrong operator tokens on purpose, more than the failure limit allows one address
    environ = {"FEDZOO_RATE_LIMIT_OPERATOR_AUTH_FAILURES_PER_ADDRESS": "off"}
    with LoopbackServer(root / "server", deadline_check_s=0.2, viewer_token=VIEWER_TOKEN, environ=environ) as server:
        with Simulation(federation, server.url, cache_root=root / "devices") as sim:
            sim.publish_base_model()
            sim.register_devices()
            records = sim.run({**ROUND, "num_rounds": 2})
            assert [record.state for record in records] == ["closed", "closed"]
            yield server, sim, records


def invoke(*args: str, env: dict[str, str] | None = None):
    """The CLI in this process (stdout and stderr apart) with the viewer token; returns click's result."""
    return CliRunner().invoke(cli, list(args), env={**VIEWER, **(env or {})}, catch_exceptions=False)


def run_main(capsys, monkeypatch, *args: str, env: dict[str, str]) -> tuple[int, str, str]:
    """The entry point a user runs (errors turned into messages), in this process: (exit code, stdout, stderr)."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code = 0
    try:
        main(list(args))
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def run_fedzoo(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The CLI as a user runs it: its own process, through the entry point that turns errors into messages."""
    return subprocess.run([sys.executable, "-c", "from fedzoo.cli import main; main()", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})


def test_models_list_json_is_the_servers_page(fleet):
    server, sim, records = fleet
    result = invoke("models", "list", "--server", server.url, "--format", "json")
    assert result.exit_code == 0, result.output
    page = json.loads(result.stdout)
    assert page == sim.admin.list_models()
    assert page["total"] == 3 and page["next_offset"] is None
    assert {card["id"] for card in page["models"]} == {sim.federation.card.id, *(r.result_model_id for r in records)}


def test_models_list_pages_filters_and_all(fleet):
    server, sim, _ = fleet
    first = json.loads(invoke("models", "list", "--server", server.url, "--format", "json", "--limit", "2").stdout)
    second = json.loads(invoke("models", "list", "--server", server.url, "--format", "json", "--limit", "2",
                               "--offset", "2").stdout)
    assert (len(first["models"]), first["next_offset"], len(second["models"]), second["next_offset"]) == (2, 2, 1, None)
    everything = json.loads(invoke("models", "list", "--server", server.url, "--format", "json", "--all").stdout)
    assert [card["id"] for card in everything["models"]] == [card["id"] for card in first["models"] + second["models"]]
    none = json.loads(invoke("models", "list", "--server", server.url, "--format", "json", "--task", "mnist").stdout)
    assert none["models"] == [] and none["total"] == 0
    int8 = json.loads(invoke("models", "list", "--server", server.url, "--format", "json", "--precision", "int8").stdout)
    assert int8["total"] == 0  # every model here is fp32


def test_models_table_and_show(fleet):
    server, sim, records = fleet
    env = {"FEDZOO_SERVER": server.url, "COLUMNS": "200"}
    table = invoke("models", "list", env=env)
    assert table.exit_code == 0 and all(r.result_model_id in table.stdout for r in records)
    assert "1-3 of 3" in table.stdout
    model_id = records[-1].result_model_id
    shown = json.loads(invoke("models", "show", model_id, "--format", "json", env=env).stdout)
    assert shown == sim.admin.http.get_json(f"/v1/models/{model_id}")
    fields = invoke("models", "show", model_id, env=env).stdout
    assert model_id in fields and f"{shown['metrics']['accuracy']}" in fields and shown["sha256"] in fields


def viewer_get(server, path: str, **params):
    return httpx.get(f"{server.url}{path}", params=params, headers={"Authorization": f"Bearer {VIEWER_TOKEN}"}).json()


def test_rounds_show_json_is_the_round_and_its_participants(fleet):
    server, sim, records = fleet
    for record in records:
        result = invoke("fl", "rounds", "show", str(record.round_id), "--server", server.url, "--format", "json")
        shown = json.loads(result.stdout)
        assert shown["round"] == sim.admin.fl_round(record.round_id)
        assert shown["participants"] == viewer_get(server, f"/v1/fl/rounds/{record.round_id}/participants")["participants"]
        assert sorted(p["status"] for p in shown["participants"]).count("accepted") == record.accepted_updates
    table = invoke("fl", "rounds", "show", str(records[0].round_id), "--server", server.url,
                   env={"COLUMNS": "250"}).stdout
    assert "closed" in table and records[0].result_model_id in table
    assert all(p["device_id"] in table for p in shown["participants"])


def test_rounds_list_json_filters_and_pages(fleet):
    server, sim, records = fleet
    plan_id = records[0].round_id
    listed = json.loads(invoke("fl", "rounds", "list", "--server", server.url, "--format", "json", "--plan-id",
                               str(plan_id)).stdout)
    assert listed == viewer_get(server, "/v1/fl/rounds", plan_id=plan_id)
    assert sorted(view["id"] for view in listed["rounds"]) == [record.round_id for record in records]
    assert {view["accuracy"] for view in listed["rounds"]} == {record.accuracy for record in records}
    closed = json.loads(invoke("fl", "rounds", "list", "--server", server.url, "--format", "json", "--state", "closed",
                               "--task", "digits", "--all").stdout)
    assert {view["id"] for view in closed["rounds"]} >= {record.round_id for record in records}
    assert all(view["state"] == "closed" for view in closed["rounds"]) and closed["next_offset"] is None
    first = json.loads(invoke("fl", "rounds", "list", "--server", server.url, "--format", "json", "--limit", "1",
                              "--plan-id", str(plan_id)).stdout)
    assert len(first["rounds"]) == 1 and first["next_offset"] == 1 and first["total"] == 2
    table = invoke("fl", "rounds", "list", "--server", server.url, "--plan-id", str(plan_id),
                   env={"COLUMNS": "250"}).stdout
    assert all(record.result_model_id in table for record in records) and "1-2 of 2" in table


def test_devices_list_and_classes(fleet):
    server, sim, _ = fleet
    listed = json.loads(invoke("devices", "list", "--server", server.url, "--format", "json", "--all").stdout)
    assert listed["devices"] == viewer_get(server, "/v1/devices", limit=200)["devices"]
    assert {device["device_id"] for device in listed["devices"]} == {f"sim-device-{i}" for i in range(3)}
    assert all(token not in json.dumps(listed) for token in sim.tokens)
    simulated = json.loads(invoke("devices", "list", "--server", server.url, "--format", "json", "--device-class",
                                  "simulated").stdout)
    assert simulated["total"] == 3
    classes = json.loads(invoke("devices", "classes", "--server", server.url, "--format", "json").stdout)
    assert [(row["device_class"], row["devices"]) for row in classes["device_classes"]] == [("simulated", 3)]
    table = invoke("devices", "list", "--server", server.url, "--token", VIEWER_TOKEN,
                   env={"COLUMNS": "250", "FEDZOO_VIEWER_TOKEN": ""}).stdout
    assert "sim-device-2" in table and "1-3 of 3" in table


def test_models_lineage_and_latency(fleet):
    server, sim, records = fleet
    newest = records[-1].result_model_id
    lineage = json.loads(invoke("models", "lineage", newest, "--server", server.url, "--format", "json").stdout)
    assert lineage == viewer_get(server, f"/v1/models/{newest}/lineage")
    assert [node["id"] for node in lineage["ancestors"]] == [sim.federation.card.id, records[0].result_model_id]
    assert lineage["model"]["stage"] == "federated"
    table = invoke("models", "lineage", sim.federation.card.id, "--server", server.url, env={"COLUMNS": "250"}).stdout
    assert newest in table and "descendant" in table
    latency = json.loads(invoke("models", "latency", newest, "--server", server.url, "--format", "json").stdout)
    assert latency == viewer_get(server, f"/v1/models/{newest}/latency")


@pytest.mark.parametrize("command", [["devices", "list"], ["fl", "rounds", "list"], ["fl", "rounds", "show", "1"],
                                     ["models", "lineage", "x"]])
def test_operator_reads_need_the_viewer_or_admin_token(fleet, command, capsys, monkeypatch):
    server, sim, _ = fleet
    for env, message in (({}, "HTTP 401 unauthorized, field 'Authorization'"),
                         ({"FEDZOO_VIEWER_TOKEN": "wrong"}, "HTTP 401 invalid_token, field 'Authorization'"),
                         ({"FEDZOO_VIEWER_TOKEN": sim.tokens[0]}, "HTTP 401 invalid_token")):  # a device's token
        code, stdout, stderr = run_main(capsys, monkeypatch, *command, "--server", server.url,
                                        env={"FEDZOO_VIEWER_TOKEN": "", "FEDZOO_ADMIN_TOKEN": "", **env})
        assert code == 1 and message in stderr and stdout == "", stderr
        assert "Traceback" not in stderr
    if command[-1] == "list":  # the admin token reads as well
        code, stdout, stderr = run_main(capsys, monkeypatch, *command, "--format", "json", "--server", server.url,
                                        env={"FEDZOO_VIEWER_TOKEN": "", "FEDZOO_ADMIN_TOKEN": server.admin_token})
        assert code == 0 and json.loads(stdout)["total"] >= 1, stderr


def test_watch_a_closed_round_prints_its_state_and_exits_zero(fleet):
    server, _, records = fleet
    result = invoke("fl", "rounds", "watch", str(records[1].round_id), "--server", server.url, "--format", "json")
    assert result.exit_code == 0
    changes = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(c["round_id"], c["state"], c["accepted_updates"]) for c in changes] == [
        (records[1].round_id, "closed", records[1].accepted_updates)]


def test_watch_follows_a_live_round_until_it_closes(fleet):
    server, sim, _ = fleet
    round_id = sim.start_plan({**ROUND, "min_clients": 3, "deadline_s": 30})
    worker = threading.Thread(target=sim.run_round, args=(round_id,))
    worker.start()
    try:
        result = invoke("fl", "rounds", "watch", str(round_id), "--server", server.url, "--interval-s", "0.1",
                        "--timeout-s", "60")
    finally:
        worker.join()
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert f"round {round_id} closed: new model" in lines[-1]
    assert any(": collecting," in line or ": open," in line for line in lines[:-1])
    assert sim.admin.fl_round(round_id)["state"] == "closed"


def test_watch_a_failed_round_exits_non_zero_with_its_reason(fleet):
    server, sim, _ = fleet
    round_id = sim.start_plan({**ROUND, "min_clients": 2, "target_clients": 2, "deadline_s": 0.5})
    result = run_fedzoo("fl", "rounds", "watch", str(round_id), "--interval-s", "0.2", "--timeout-s", "60",
                        env={"FEDZOO_SERVER": server.url, **VIEWER})
    assert result.returncode == 1, result.stderr
    assert f"error: round {round_id} failed:" in result.stderr and "Traceback" not in result.stderr
    assert "failed" in result.stdout.splitlines()[-1]


def test_watch_gives_up_after_its_timeout(fleet):
    server, sim, _ = fleet
    round_id = sim.start_plan({**ROUND, "min_clients": 3, "target_clients": 3, "deadline_s": 600})
    result = run_fedzoo("fl", "rounds", "watch", str(round_id), "--interval-s", "0.1", "--timeout-s", "0.5",
                        "--format", "json", env={"FEDZOO_SERVER": server.url, **VIEWER})
    assert result.returncode == 3 and "still open after 0.5 s" in result.stderr
    assert json.loads(result.stdout.splitlines()[0])["state"] == "open"


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["models", "show", "no-such-model"], 1, "error: no model 'no-such-model' is published (HTTP 404"),
        (["models", "show", "bad id!"], 1, "HTTP 404"),
        (["fl", "rounds", "show", "999999"], 1, "HTTP 404 not_found"),
        (["models", "list", "--limit", "0"], 2, "Invalid value for '--limit'"),
        (["models", "list", "--precision", "fp16"], 2, "Invalid value for '--precision'"),
        (["models", "list", "--server", "ftp://example.org"], 2, "must be an http:// or https:// URL"),
    ],
)
def test_bad_input_is_a_message_and_an_exit_code(fleet, args, code, message, capsys, monkeypatch):
    server, _, _ = fleet
    exit_code, stdout, stderr = run_main(capsys, monkeypatch, *args, env={"FEDZOO_SERVER": server.url, **VIEWER})
    assert exit_code == code, stderr
    assert message in stderr and "Traceback" not in stderr and stdout == ""


def test_a_query_the_server_refuses_shows_its_message_and_field(fleet):
    server, _, _ = fleet
    result = run_fedzoo("models", "list", "--task", "not a task!", env={"FEDZOO_SERVER": server.url})
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "HTTP 422" in result.stderr and "field 'task'" in result.stderr


def test_an_unreachable_server_is_a_message(tmp_path):
    with LoopbackServer(tmp_path / "gone") as server:
        url = server.url
    result = run_fedzoo("models", "list", "--server", url)
    assert result.returncode == 1 and "Connection refused" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("shell, marker", [("bash", "complete -o nosort -F _fedzoo_completion fedzoo"),
                                           ("zsh", "#compdef fedzoo"), ("fish", "complete --no-files --command fedzoo")])
def test_completion_scripts(shell, marker):
    result = run_fedzoo("completion", shell)
    assert result.returncode == 0 and marker in result.stdout and "_FEDZOO_COMPLETE" in result.stdout


def test_completion_answers_subcommands_and_choices():
    def complete(words: str) -> list[str]:
        env = {"_FEDZOO_COMPLETE": "bash_complete", "COMP_WORDS": words, "COMP_CWORD": str(len(words.split()) - 1)}
        result = run_fedzoo(env=env)
        assert result.returncode == 0, result.stderr
        return [line.split(",", 1)[1] for line in result.stdout.splitlines()]

    assert complete("fedzoo fl rounds w") == ["watch"]
    assert complete("fedzoo models list --precision i") == ["int8"]
    assert "rounds" in complete("fedzoo fl r")


def test_the_sdk_reports_download_and_upload_bytes_as_they_move(fleet, tmp_path):
    from fedzoo.admin.operator_client import OperatorClient

    server, sim, _ = fleet
    heard: list[tuple[str, int, int | None]] = []
    payload = os.urandom(300_000)
    with OperatorClient(server.url, cache_dir=tmp_path / "cache",
                        progress=lambda *event: heard.append(event)) as client:
        path = client.download_model(sim.federation.card)
        sha256 = client.publish_blob(payload, server.admin_token)
    downloads = [event for event in heard if event[0].startswith("download")]
    uploads = [event for event in heard if event[0] == f"upload {sha256[:12]}"]
    size = path.stat().st_size
    assert downloads[-1][1:] == (size, size) and all(a[1] <= b[1] for a, b in zip(downloads, downloads[1:]))
    assert len(uploads) == 5 and uploads[-1][1:] == (len(payload), len(payload))  # 64 KiB chunks
    assert sim.admin.http.request("GET", f"/v1/blobs/{sha256}").content == payload


def read_all(leader: int) -> str:
    """What a process wrote to a pseudo-terminal that it has closed (Linux answers EIO at the end)."""
    chunks = []
    try:
        while chunk := os.read(leader, 1 << 16):
            chunks.append(chunk)
    except OSError:
        pass
    os.close(leader)
    return b"".join(chunks).decode(errors="replace")


def test_download_progress_bar_on_a_terminal_only(fleet, tmp_path):
    import pty

    server, sim, _ = fleet
    model_id = sim.federation.card.id
    base = ["client", "--server", server.url, "--cache-dir"]
    piped = run_fedzoo(*base, str(tmp_path / "piped"), "download", model_id)
    assert piped.returncode == 0 and piped.stderr == ""
    for cache, extra, bar_expected in (("tty", [], True), ("quiet", ["--quiet"], False)):
        leader, follower = pty.openpty()
        process = subprocess.run([sys.executable, "-c", "from fedzoo.cli import main; main()", *base,
                                  str(tmp_path / cache), "download", model_id, *extra],
                                 stdout=subprocess.PIPE, stderr=follower, text=True, timeout=120)
        os.close(follower)
        drawn = read_all(leader)
        assert process.returncode == 0 and model_id not in drawn
        assert ("download " + sim.federation.card.sha256[:12] in drawn) is bar_expected, drawn


def test_a_refused_token_is_the_servers_message_and_field(fleet, tmp_path):
    server, _, _ = fleet
    result = run_fedzoo("client", "--server", server.url, "--token", "not-a-device-token", "--state",
                        str(tmp_path / "none.json"), "lookup", "--task", "digits", "--latency-budget-ms", "5",
                        "--format", "json")
    assert result.returncode == 1 and result.stdout == "" and "Traceback" not in result.stderr
    assert "(HTTP 401 invalid_token, field 'Authorization')" in result.stderr


def test_zoo_show_of_a_round_without_a_zoo_outcome_is_a_message_not_a_traceback():
    from fedzoo.admin.operator_cli import zoo_round_report

    with pytest.raises(click.ClickException, match="round 3 is closed and has no zoo-wide outcome"):
        zoo_round_report({"id": 3, "state": "closed", "outcome": {"metrics": {"accuracy": 0.9}}})


def test_zoo_start_with_a_file_that_is_not_json_names_the_argument(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text("{not json")
    result = CliRunner().invoke(cli, ["fl", "zoo", "start", str(plan), "--admin-token", "t", "--server",
                                      "http://127.0.0.1:9"])
    assert result.exit_code == 2 and "is not JSON" in result.output and "Traceback" not in result.output
