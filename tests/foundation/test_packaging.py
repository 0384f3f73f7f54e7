"""Packaging: the device side imports without torch, the core without dp-accounting, and every area lives
under `fedzoo.`."""

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
AREAS = ("cloud", "edge", "nas", "compress", "server", "clients", "graphs", "admin")

def blocker(package: str) -> str:
    """A script prologue after which importing `package` (or any of its modules) raises ImportError."""
    return textwrap.dedent(
        f"""
        import importlib.abc, sys

        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "{package}" or name.startswith("{package}."):
                    raise ImportError(f"{package} is blocked here (import of {{name}})")
                return None

        sys.meta_path.insert(0, Block())
        """
    )


BLOCK_TORCH = blocker("torch")


def modules_in(folder: str) -> list[str]:
    """Every module of an area folder (or of fedzoo/, the core) by its installed name."""
    package = ["fedzoo"] if folder == "fedzoo" else ["fedzoo", folder]
    names = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        relative = path.relative_to(ROOT / folder).with_suffix("")
        names.append(".".join([*package, *(part for part in relative.parts if part != "__init__")]))
    return names


def imports_cleanly(modules: list[str], blocked: str) -> subprocess.CompletedProcess:
    imports = "\n".join(f"import {name}" for name in modules)
    script = f"{blocker(blocked)}{imports}\nprint('ok', {blocked!r} in sys.modules)"
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)


def test_device_side_imports_without_torch():
    result = imports_cleanly(modules_in("fedzoo") + modules_in("edge") + modules_in("clients"), "torch")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["ok", "False"]


def test_the_core_imports_without_dp_accounting():
    """dp-accounting comes with the server and cloud extras: the core imports it only where an epsilon is computed."""
    result = imports_cleanly(modules_in("fedzoo"), "dp_accounting")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["ok", "False"]


def test_blocker_really_blocks_torch():
    result = subprocess.run([sys.executable, "-c", BLOCK_TORCH + "import torch"], capture_output=True, text=True)
    assert result.returncode != 0 and "blocked" in result.stderr


def test_every_area_package_is_declared_under_fedzoo():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    declared = set(config["packages"])
    for area in AREAS:
        assert config["package-dir"][f"fedzoo.{area}"] == area
        for init in (ROOT / area).rglob("__init__.py"):
            package = ".".join(["fedzoo", area, *init.parent.relative_to(ROOT / area).parts])
            assert package in declared, f"{package} is missing from [tool.setuptools] packages"
    assert not any(name in declared for name in ("server", "clients"))


@pytest.mark.parametrize("area", AREAS)
def test_area_imports_under_namespace(area):
    module = __import__(f"fedzoo.{area}", fromlist=["_"])
    assert Path(module.__file__).parent == ROOT / area


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Set up and run", 1)[1].split("\n## ", 1)[0]
    return [block.split("\n", 1)[1].strip() for block in section.split("```bash")[1:]]


def test_readme_set_up_is_two_commands_and_ci_runs_the_same():
    install_and_demo, run_tests = [block.split("```")[0].strip() for block in readme_commands()]
    ci_script = (ROOT / ".ci" / "run").read_text()
    assert "pip install -e '.[all,dev]'" in install_and_demo and "fedzoo demo" in install_and_demo
    assert "pip install --quiet -e '.[all,dev]'" in ci_script
    assert run_tests in ci_script.splitlines()
    # and the README's first command as a newcomer types it, from the repository root, after the tests
    assert ".venv/bin/fedzoo demo --preset tiny" in ci_script.splitlines()
