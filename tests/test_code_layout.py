"""The code's architecture, checked: ui/ never imports the tests, and the token sources are named in one
place (tokenswift/kinds.py) as enum members, never as bare strings elsewhere in the package or the app."""
import ast
from pathlib import Path

from tokenswift.kinds import Source

ROOT = Path(__file__).resolve().parents[1]
# The training scripts are outside the rule: their reports name a head's index "head" (a field, not a source).
CODE = sorted(p for p in [*ROOT.glob("tokenswift/**/*.py"), *ROOT.glob("ui/**/*.py"), ROOT / "app.py"]
              if "train" not in p.relative_to(ROOT).parts)


def test_ui_never_imports_from_tests():
    for path in ROOT.glob("ui/**/*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n == "tests" or n.startswith("tests.") or n in ("conftest", "app_server") for n in names), path
        assert "sys.path" not in path.read_text() or "tests" not in path.read_text(), path


def test_token_sources_are_never_bare_strings_outside_their_enum():
    sources = {s.value for s in Source}
    found = []
    for path in CODE:
        if path.name == "kinds.py":
            continue
        tree = ast.parse(path.read_text())
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)) and n.body
                      and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        in_fstrings = {id(part) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for part in n.values}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in sources and id(node) not in docstrings | in_fstrings:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
    assert not found, "token sources written as strings:\n" + "\n".join(found)
