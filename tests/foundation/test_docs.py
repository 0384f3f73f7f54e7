"""The project's own docs: every relative link resolves, every command is documented, and nothing points
outside the repository at the engineers' shared notes."""

import os
import re
from pathlib import Path

import click
import pytest

from fedzoo.cli import cli

ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# built by concatenation so that this file does not match itself
FORBIDDEN = ("../" + "shared", "/work/" + "shared")
SKIPPED_DIRECTORIES = {".git", ".venv", "venv", "node_modules", "target", "__pycache__", ".pytest_cache", "build", "dist"}


def heading_anchors(markdown: str) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    anchors = set()
    for heading in re.findall(r"^#+\s+(.+)$", markdown, flags=re.MULTILINE):
        anchors.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return anchors


@pytest.mark.parametrize("page", DOC_FILES, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    text = page.read_text()
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        assert resolved.exists(), f"{page.name} links to {target}, which does not exist"
        assert ROOT in resolved.parents or resolved == ROOT, f"{page.name} links outside the repository: {target}"
        if anchor and resolved.suffix == ".md":
            assert anchor in heading_anchors(resolved.read_text()), f"{page.name} links to a missing heading: {target}"


def test_the_docs_index_lists_every_page():
    index = (ROOT / "docs" / "README.md").read_text()
    for page in (ROOT / "docs").glob("*.md"):
        if page.name != "README.md":
            assert f"]({page.name})" in index, f"docs/README.md does not link {page.name}"
    assert "](docs/README.md)" in (ROOT / "README.md").read_text()


def repository_files():
    for directory, subdirectories, files in os.walk(ROOT):
        subdirectories[:] = [name for name in subdirectories
                             if name not in SKIPPED_DIRECTORIES and not name.endswith(".egg-info")]
        for name in files:
            yield Path(directory) / name


def test_nothing_points_at_the_shared_notes():
    offenders = []
    for path in repository_files():
        data = path.read_bytes()
        offenders += [f"{path.relative_to(ROOT)}: {pattern}" for pattern in FORBIDDEN if pattern.encode() in data]
    assert offenders == []


def command_paths(group: click.Group, prefix: tuple[str, ...] = ()) -> list[str]:
    context = click.Context(group)
    paths = []
    for name in group.list_commands(context):
        command = group.get_command(context, name)
        if isinstance(command, click.Group):
            paths += command_paths(command, (*prefix, name))
        else:
            paths.append(" ".join((*prefix, name)))
    return paths


def test_every_command_is_in_the_cli_page():
    page = (ROOT / "docs" / "cli.md").read_text()
    missing = [path for path in command_paths(cli) if f"`fedzoo {path}`" not in page]
    assert missing == []


def _normalised(path: str) -> str:
    """/v1/models/{model_id} and /v1/models/<id> alike become /v1/models/<>."""
    return re.sub(r"[{<][^}>]*[}>]", "<>", path)


def test_every_endpoint_of_the_openapi_document_is_in_the_rest_api_page(tmp_path):
    pytest.importorskip("flask")
    from fedzoo.server.app import create_app
    from fedzoo.server.config import ServerConfig

    app = create_app(ServerConfig.from_env(environ={}, data_dir=tmp_path))
    document = app.test_client().get("/v1/openapi.json").get_json()
    served = {f"{method.upper()} {_normalised(path)}" for path, operations in document["paths"].items()
              for method in operations}
    page = (ROOT / "docs" / "rest-api.md").read_text()
    documented = {f"{method} {_normalised(path)}" for method, path in
                  re.findall(r"`(GET|POST|PUT|PATCH|DELETE) (/v1/[^`?\s]*)", page)}
    assert sorted(served - documented) == []
