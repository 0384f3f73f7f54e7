"""`fedzoo zoo build|list|show` through the real CLI entry point: help, a tiny build, and clear errors."""

import json

import pytest
from click.testing import CliRunner

from fedzoo.cards import is_supernet
from fedzoo.cli import cli, main
from fedzoo.signing import CardSigningKey, TrustedKeys, verify_card
from fedzoo.zoo import Zoo

TINY_BUILD = ["--preset", "tiny", "--no-compress", "--no-training-graphs"]
TINY = [*TINY_BUILD, "--unsigned"]
# builds whose tests read what the CLI writes, not what training reached: one epoch, no fine-tune (~3x faster)
BRIEF_TRAINING = ["--epochs", "1", "--finetune-epochs", "0"]


def run_main(argv, capsys):
    """Run `fedzoo.cli.main` and return (exit code, stdout, stderr)."""
    code = 0
    try:
        main(argv)
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("command", [["zoo"], ["zoo", "build"], ["zoo", "list"], ["zoo", "show"]])
def test_every_zoo_command_has_help(command):
    result = CliRunner().invoke(cli, [*command, "--help"])
    assert result.exit_code == 0
    assert "Usage:" in result.output


def test_build_help_names_the_options():
    output = CliRunner().invoke(cli, ["zoo", "build", "--help"]).output
    for option in ("--dataset", "--out", "--latency-budget-ms", "--max-params", "--executor", "--no-compress", "--seed",
                   "--finetune-epochs", "--largest-only-epochs", "--budget-macs"):
        assert option in output
    assert "--stop-after-epoch" not in output  # testing hook, hidden


@pytest.mark.slow
def test_build_then_list_and_show(tmp_path, capsys):
    out = tmp_path / "zoo"
    key = CardSigningKey.generate()
    key.save(tmp_path / "operator.pem")
    code, stdout, stderr = run_main(["zoo", "build", "--dataset", "digits", "--out", str(out), *TINY_BUILD,
                                     *BRIEF_TRAINING, "--signing-key", str(tmp_path / "operator.pem")], capsys)
    assert code == 0, stderr
    cards = Zoo(out).cards()
    assert len(cards) >= 8
    for card in cards:  # every card signed by the operator's key
        verify_card(card, TrustedKeys([key.public_key_raw]))
    assert "compress" not in stderr  # skipped on request, not reported as missing
    assert "stage times, wall s: data" in stderr and "search" in stderr
    code, stdout, _ = run_main(["zoo", "list", "--zoo", str(out)], capsys)
    assert code == 0 and all(card.id in stdout for card in cards)
    code, stdout, _ = run_main(["zoo", "list", "--zoo", str(out), "--format", "json"], capsys)
    listed = json.loads(stdout)
    assert code == 0 and listed["total"] == len(cards)
    assert sorted(card["id"] for card in listed["models"]) == sorted(card.id for card in cards)
    code, stdout, _ = run_main(["zoo", "show", cards[0].id, "--zoo", str(out), "--format", "json"], capsys)
    assert code == 0 and json.loads(stdout)["id"] == cards[0].id
    code, stdout, _ = run_main(["zoo", "show", cards[0].id, "--zoo", str(out)], capsys)
    assert code == 0 and "metrics.accuracy" in stdout and cards[0].id in stdout


@pytest.mark.slow
def test_build_on_mnist1d(tmp_path, capsys):
    """mnist1d's signals enter the 2-D search space as 21 x 21 Hankel images (cloud.data.hankel_images)."""
    out = tmp_path / "zoo"
    code, _, stderr = run_main(["zoo", "build", "--dataset", "mnist1d", "--out", str(out), *TINY, "--finetune-epochs", "0"],
                               capsys)
    assert code == 0, stderr
    cards = Zoo(out).cards()
    assert cards and all(card.input.shape[1:] == [1, 21, 21] for card in cards)
    assert all(card.id.startswith("mnist1d-") for card in cards)
    assert max(card.metrics.accuracy for card in cards) > 0.2  # above chance (0.1) on 10 digits


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--dataset", "cifar"], "unknown data set 'cifar'"),
        (["--dataset", "digits", "--latency-budget-ms", "0.0001"], "no subnet fits --latency-budget-ms"),
        (["--dataset", "digits", "--max-params", "5"], "no subnet fits --max-params 5"),
        (["--dataset", "digits", "--budget-macs", "200000", "--budget-macs", "1000"], "no subnet fits --budget-macs 1000"),
    ],
)
def test_bad_build_input_gives_one_line_errors(tmp_path, capsys, arguments, message):
    code, _, stderr = run_main(["zoo", "build", "--out", str(tmp_path / "zoo"), *TINY, *arguments], capsys)
    assert code == 1
    assert message in stderr and "Traceback" not in stderr


def test_more_largest_only_epochs_than_epochs_are_refused_before_any_work(tmp_path, capsys):
    code, _, stderr = run_main(["zoo", "build", "--out", str(tmp_path / "zoo"), "--dataset", "digits", *TINY,
                                "--epochs", "2", "--largest-only-epochs", "3"], capsys)
    assert code == 1 and "--largest-only-epochs 3 exceeds the supernet's --epochs 2" in stderr
    assert "Traceback" not in stderr and not (tmp_path / "zoo").exists()


def test_a_negative_finetune_is_refused_before_any_work(tmp_path, capsys):
    code, _, stderr = run_main(["zoo", "build", "--out", str(tmp_path / "zoo"), "--dataset", "digits", *TINY,
                                "--finetune-epochs", "-1"], capsys)
    assert code == 2 and "--finetune-epochs" in stderr and "Traceback" not in stderr
    assert not (tmp_path / "zoo").exists()


@pytest.mark.parametrize("budget", ["0", "-5", "many"])
def test_a_budget_that_is_not_a_positive_count_is_refused_before_any_work(tmp_path, capsys, budget):
    code, _, stderr = run_main(["zoo", "build", "--out", str(tmp_path / "zoo"), "--dataset", "digits", *TINY,
                                "--budget-macs", budget], capsys)
    assert code == 2 and "--budget-macs" in stderr and "Traceback" not in stderr
    assert not (tmp_path / "zoo").exists()


@pytest.mark.slow
def test_build_for_the_fleets_budgets(tmp_path, capsys):
    """--budget-macs (repeatable) gives the zoo for the fleet's tiers: at most one model a budget, each within one."""
    out = tmp_path / "zoo"
    budgets = (150_000, 250_000)  # the tiny space's subnets span about 0.09 to 0.35 MMACs on 8x8 digits
    code, _, stderr = run_main(["zoo", "build", "--dataset", "digits", "--out", str(out), *TINY, *BRIEF_TRAINING,
                                *(f"--budget-macs={budget}" for budget in budgets)], capsys)
    assert code == 0, stderr
    models = [card for card in Zoo(out).cards() if not is_supernet(card)]
    assert 1 <= len(models) <= len(budgets)
    assert min(card.macs for card in models) <= budgets[0] and max(card.macs for card in models) <= budgets[1]


def test_out_pointing_to_a_file_is_refused(tmp_path, capsys):
    target = tmp_path / "zoo.txt"
    target.write_text("not a zoo")
    code, _, stderr = run_main(["zoo", "build", "--dataset", "digits", "--out", str(target), *TINY], capsys)
    assert code == 1 and "is a file" in stderr
    assert target.read_text() == "not a zoo"


def test_show_and_list_of_missing_things(tmp_path, capsys):
    code, _, stderr = run_main(["zoo", "list", "--zoo", str(tmp_path)], capsys)
    assert code == 1 and "is not a fedzoo zoo" in stderr
    Zoo.create(tmp_path / "empty")
    code, _, stderr = run_main(["zoo", "show", "nope", "--zoo", str(tmp_path / "empty")], capsys)
    assert code == 1 and "no model card 'nope'" in stderr


@pytest.mark.parametrize("flags, synchronised", [([], False), (["--sync-batchnorm"], True)])
def test_batch_norm_is_worker_local_unless_sync_batchnorm_is_asked_for(tmp_path, capsys, monkeypatch, flags, synchronised):
    from fedzoo.cloud import pipeline
    from fedzoo.errors import InvalidInputError

    seen = []

    def record_and_stop(config, reporter=None):
        seen.append(config)
        raise InvalidInputError("stopped by the test before training", field="workers")

    monkeypatch.setattr(pipeline, "build_zoo", record_and_stop)
    code, _, stderr = run_main(["zoo", "build", "--dataset", "digits", "--out", str(tmp_path / "zoo"), *TINY,
                                "--workers", "2", *flags], capsys)
    assert code == 1 and "stopped by the test" in stderr
    assert seen[0].training_workers == 2 and seen[0].sync_batchnorm is synchronised
