"""`fedzoo keys` and `fedzoo zoo sign` through the real CLI entry point: key files, the exported key set,
rotation by retiring, and a private key that is never printed."""

import hashlib
import json

import pytest

from fedzoo.cards import ModelCard
from fedzoo.cli import main
from fedzoo.privacy_terms import verify_privacy_terms
from fedzoo.revocation import verify_revocation_list
from fedzoo.signing import CardSigningKey, TrustedKeys, verify_card
from fedzoo.zoo import Zoo


def run_main(argv, capsys):
    """Run `fedzoo.cli.main`; returns (exit code, stdout, stderr)."""
    code = 0
    try:
        main(argv)
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _generate(keys_dir, capsys) -> CardSigningKey:
    code, stdout, _ = run_main(["keys", "generate", "--keys-dir", str(keys_dir)], capsys)
    assert code == 0
    key_id = stdout.split()[2].rstrip(":")
    return CardSigningKey.load(keys_dir / f"{key_id}.pem")


def test_generate_writes_an_owner_only_pem_and_never_prints_the_private_key(tmp_path, capsys):
    keys_dir = tmp_path / "keys"
    key = _generate(keys_dir, capsys)
    path = keys_dir / f"{key.key_id}.pem"
    assert path.stat().st_mode & 0o777 == 0o600 and keys_dir.stat().st_mode & 0o777 == 0o700
    pem_body = "".join(path.read_text().splitlines()[1:-1])
    outputs = []
    for command in (["list"], ["export-public"]):
        code, stdout, stderr = run_main(["keys", *command, "--keys-dir", str(keys_dir)], capsys)
        assert code == 0
        outputs.append(stdout + stderr)
    assert all(pem_body not in text and "PRIVATE" not in text for text in outputs)
    assert key.key_id in outputs[0] and "active" in outputs[0]


def test_the_exported_set_is_what_verifiers_read_and_retiring_drops_a_key(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FEDZOO_KEYS_DIR", str(tmp_path / "keys"))
    old, new = _generate(tmp_path / "keys", capsys), _generate(tmp_path / "keys", capsys)
    code, stdout, _ = run_main(["keys", "export-public"], capsys)
    exported = json.loads(stdout)
    assert code == 0 and TrustedKeys.from_json(exported).key_ids == sorted([old.key_id, new.key_id])
    assert all(set(entry) == {"key_id", "algorithm", "public_key"} and entry["algorithm"] == "ed25519"
               for entry in exported["keys"])
    code, stdout, _ = run_main(["keys", "retire", old.key_id], capsys)
    assert code == 0 and (tmp_path / "keys" / "retired" / f"{old.key_id}.pem").is_file()
    code, _, _ = run_main(["keys", "export-public", "--out", str(tmp_path / "fleet.json")], capsys)
    assert code == 0 and TrustedKeys.load(tmp_path / "fleet.json").key_ids == [new.key_id]
    code, stdout, _ = run_main(["keys", "list"], capsys)
    assert f"{old.key_id}  retired" in stdout and f"{new.key_id}  active" in stdout


@pytest.mark.parametrize("command, message", [
    (["keys", "retire", "0123456789abcdef"], "no active key 0123456789abcdef"),
    (["keys", "retire", "not-hex"], "16 lowercase hex digits"),
    (["keys", "export-public"], "no active key in"),
])
def test_key_commands_fail_with_one_line_messages(tmp_path, capsys, command, message):
    code, _, stderr = run_main([*command, "--keys-dir", str(tmp_path / "keys")], capsys)
    assert code != 0 and message in stderr and "Traceback" not in stderr


def _zoo_with_one_card(root) -> Zoo:
    zoo = Zoo.create(root)
    model = b"not really onnx, but a blob the card hashes"
    zoo.add_blob_bytes(model)
    zoo.add_card(ModelCard.from_dict({
        "id": "m1", "family": "f", "task": "digits", "input": {"name": "input", "shape": ["batch", 1, 8, 8]},
        "labels": ["a", "b"], "metrics": {"accuracy": 0.5, "num_examples": 10}, "macs": 1, "params": 1,
        "size_bytes": len(model), "sha256": hashlib.sha256(model).hexdigest()}))
    return zoo


def test_zoo_sign_signs_every_card_and_re_signing_moves_them_to_a_new_key(tmp_path, capsys):
    zoo = _zoo_with_one_card(tmp_path / "zoo")
    old, new = _generate(tmp_path / "keys", capsys), _generate(tmp_path / "keys", capsys)
    for key in (old, new):
        code, stdout, _ = run_main(["zoo", "sign", "--zoo", str(zoo.root), "--signing-key",
                                    str(tmp_path / "keys" / f"{key.key_id}.pem")], capsys)
        assert code == 0 and "signed 1 cards" in stdout
        card = zoo.card("m1")
        assert card.signature.key_id == key.key_id
        verify_card(card, TrustedKeys([key.public_key_raw]))


def test_zoo_build_refuses_to_guess_without_a_key_or_unsigned(tmp_path, capsys):
    out = tmp_path / "zoo"
    code, _, stderr = run_main(["zoo", "build", "--dataset", "digits", "--out", str(out)], capsys)
    assert code != 0 and "--signing-key" in stderr and "--unsigned" in stderr
    assert not out.exists()  # refused before any work
    bogus = tmp_path / "bogus.pem"
    bogus.write_text("nope")
    code, _, stderr = run_main(["zoo", "build", "--dataset", "digits", "--out", str(out), "--signing-key", str(bogus)],
                               capsys)
    assert code == 1 and "bogus.pem is not an unencrypted PEM private key" in stderr and not out.exists()


def test_keys_revoke_signs_a_list_the_pinned_keys_verify_and_refuses_bad_input(tmp_path, capsys):
    key_path = tmp_path / "keys" / f"{_generate(tmp_path / 'keys', capsys).key_id}.pem"
    out = tmp_path / "revocations.json"
    code, stdout, _ = run_main(["keys", "revoke", "--signing-key", str(key_path), "--version", "4",
                                "--card-id", "digits-v3-r12", "--card-sha256", "ab" * 32, "--device-key", "cd" * 32,
                                "--out", str(out)], capsys)
    assert code == 0 and "version 4 (1 card ids, 1 model sha256s, 1 device keys)" in stdout
    listed = verify_revocation_list(json.loads(out.read_text()),
                                    TrustedKeys([CardSigningKey.load(key_path).public_key_raw]))
    assert (listed.version, listed.card_ids, listed.card_sha256s) == (4, {"digits-v3-r12"}, {"ab" * 32})
    assert listed.device_key_fingerprints == {"cd" * 32}
    assert "PRIVATE" not in out.read_text()
    code, _, stderr = run_main(["keys", "revoke", "--signing-key", str(key_path), "--version", "5",
                                "--card-sha256", "not-a-digest", "--out", str(tmp_path / "bad.json")], capsys)
    assert code != 0 and "revoked_cards.sha256s" in stderr and "Traceback" not in stderr
    code, _, stderr = run_main(["keys", "revoke", "--signing-key", str(key_path), "--version", "5",
                                "--device-key", "phone-17", "--out", str(tmp_path / "bad.json")], capsys)
    assert code != 0 and "revoked_device_keys" in stderr and "Traceback" not in stderr  # a fingerprint, not an id
    assert not (tmp_path / "bad.json").exists()


def test_keys_sign_privacy_terms_signs_terms_the_pinned_keys_verify_and_refuses_bad_input(tmp_path, capsys):
    key_path = tmp_path / "keys" / f"{_generate(tmp_path / 'keys', capsys).key_id}.pem"
    out = tmp_path / "terms.json"
    code, stdout, _ = run_main(["keys", "sign-privacy-terms", "--signing-key", str(key_path), "--version", "2",
                                "--line", "*=1.0", "--line", "digits-mlp=1.5", "--out", str(out)], capsys)
    assert code == 0 and "version 2 (2 lines: *, digits-mlp)" in stdout
    operator = TrustedKeys([CardSigningKey.load(key_path).public_key_raw])
    terms = verify_privacy_terms(json.loads(out.read_text()), operator)
    assert terms.version == 2
    assert (terms.for_line("digits-mlp").minimum_noise_multiplier, terms.for_line("other").minimum_noise_multiplier) \
        == (1.5, 1.0)
    assert "PRIVATE" not in out.read_text()
    for line, field in (("*=-1", "minimum_noise_multiplier"), ("digits", "LINE=Z_MIN"), ("bad line!=1", "lines")):
        code, _, stderr = run_main(["keys", "sign-privacy-terms", "--signing-key", str(key_path), "--version", "3",
                                    "--line", line, "--out", str(tmp_path / "bad.json")], capsys)
        assert code != 0 and field in stderr and "Traceback" not in stderr, (line, stderr)
    assert not (tmp_path / "bad.json").exists()
