"""The import contracts of pyproject.toml ([tool.importlinter]) hold, checked by import-linter on the installed
layout (`.ci/lint-imports`), and a broken one fails the check."""

import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT = ROOT / ".ci" / "lint-imports"
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())


def lint(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(LINT), *arguments], capture_output=True, text=True, timeout=300)


def test_every_contract_is_kept():
    result = lint()
    contracts = CONFIG["tool"]["importlinter"]["contracts"]
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"Contracts: {len(contracts)} kept, 0 broken." in result.stdout


def test_every_area_has_a_place_in_the_layers():
    """A new area folder must say where it sits, or nothing checks what it imports."""
    layers = next(contract for contract in CONFIG["tool"]["importlinter"]["contracts"] if contract["id"] == "layers")
    placed = {name.strip() for layer in layers["layers"] for name in re.split(r"[|:]", layer)}
    areas = {name.removeprefix("fedzoo.") for name in CONFIG["tool"]["setuptools"]["package-dir"] if name != "fedzoo"}
    assert areas - placed == set()


def test_an_import_against_a_contract_breaks_it(tmp_path):
    """The clients use the edge runtime: a contract forbidding that arrow is reported broken, naming the import
    (so the check sees the area packages, rather than passing on a layout without them)."""
    config = tmp_path / "contracts.toml"
    config.write_text(textwrap.dedent(
        """
        [tool.importlinter]
        root_packages = ["fedzoo"]

        [[tool.importlinter.contracts]]
        name = "The client SDK never imports the edge runtime"
        type = "forbidden"
        source_modules = ["fedzoo.clients"]
        forbidden_modules = ["fedzoo.edge"]
        """
    ))
    result = lint("--config", str(config))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "The client SDK never imports the edge runtime BROKEN" in result.stdout
    assert "fedzoo.clients.client -> fedzoo.edge.runtime" in result.stdout
