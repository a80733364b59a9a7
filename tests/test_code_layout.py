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


DECODE_PATH = ("decode_loop.py", "drafters.py", "auto.py", "verifier.py", "run_state.py", "generator.py", "adapter.py",
               "lean.py", "kv_cache.py", "partial_cache.py", "backend.py")
MAX_ATTRIBUTES = 16  # issue 27: "no class with more than ~15 attributes in the decode path"


def test_no_class_in_the_decode_path_holds_more_than_about_fifteen_attributes():
    crowded = []
    for name in DECODE_PATH:
        tree = ast.parse((ROOT / "tokenswift" / name).read_text())
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            assigned = {node.attr for node in ast.walk(cls) if isinstance(node, ast.Attribute)
                        and isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name) and node.value.id == "self"}
            if len(assigned) > MAX_ATTRIBUTES:
                crowded.append(f"{name}:{cls.name} {len(assigned)}: {', '.join(sorted(assigned))}")
    assert not crowded, "\n".join(crowded)
