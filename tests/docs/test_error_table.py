"""docs/rest-api.md's error table lists every error code the server raises, under the status it is sent with.
The codes are read from the server's source: each raise of an `fedzoo.server.errors` class, with its `code=`
or the class's own code, and the codes werkzeug's own errors are mapped to."""

import ast
import re
from pathlib import Path

from fedzoo.server.app import WERKZEUG_CODES

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "server"
TABLE_ROW = re.compile(r"^\| (\d{3}|other) \| ([^|]*) \|", re.MULTILINE)


def error_classes() -> dict[str, tuple[int, str]]:
    """Each error class of server/errors.py with its (status, code); what a class does not set, it inherits."""
    classes: dict[str, tuple[int, str]] = {}
    for node in ast.parse((SERVER / "errors.py").read_text()).body:
        if not isinstance(node, ast.ClassDef):
            continue
        status, code = classes.get(node.bases[0].id, (None, None)) if node.bases else (None, None)
        for statement in node.body:
            if not isinstance(statement, ast.Assign):
                continue
            target = statement.targets[0]
            names = [element.id for element in target.elts] if isinstance(target, ast.Tuple) else [target.id]
            values = ast.literal_eval(statement.value)
            assigned = dict(zip(names, values if isinstance(target, ast.Tuple) else [values]))
            status, code = assigned.get("status", status), assigned.get("code", code)
        classes[node.name] = (status, code)
    return classes


def raised_codes() -> set[tuple[int | None, str]]:
    """(status, code) of every error the server's modules construct; status None where it is set at run time."""
    classes = error_classes()
    found: set[tuple[int | None, str]] = set()
    for path in SERVER.rglob("*.py"):
        if path == SERVER / "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in classes):
                continue
            status, code = classes[node.func.id]
            if node.func.id == "APIError":  # the base class: app.py sets its status after building it
                status = None
            given = next((keyword.value for keyword in node.keywords if keyword.arg == "code"), None)
            if given is None:
                found.add((status, code))
            elif isinstance(given, ast.Constant):
                found.add((status, given.value))
            else:  # a computed code (werkzeug's errors): every literal it can take, sent with its own status
                found |= {(None, constant.value) for constant in ast.walk(given)
                          if isinstance(constant, ast.Constant) and isinstance(constant.value, str)}
    found |= {(status, code) for status, code in WERKZEUG_CODES.items()}
    return found


def documented_codes() -> dict[str, set[str]]:
    """The codes of each row of the table, by the row's status."""
    page = (ROOT / "docs" / "rest-api.md").read_text()
    table = page[page.index("| status | code | when |"):]
    documented: dict[str, set[str]] = {}
    for status, codes in TABLE_ROW.findall(table):
        documented.setdefault(status, set()).update(re.findall(r"`([a-z_]+)`", codes))
    return documented


def test_the_scan_finds_the_codes_it_must():
    codes = {code for _, code in raised_codes()}
    assert {"no_model_fits", "enrollment_required", "internal_error", "rate_limited", "http_error"} <= codes


def test_every_raised_error_code_is_in_the_rest_api_table_under_its_status():
    documented = documented_codes()
    anywhere = set().union(*documented.values())
    missing = sorted(f"{status} {code}" for status, code in raised_codes()
                     if code not in (documented.get(str(status), set()) if status is not None else anywhere))
    assert missing == []


def test_the_table_lists_no_code_the_server_never_sends():
    raised = {code for _, code in raised_codes()}
    assert sorted(set().union(*documented_codes().values()) - raised) == []
