"""The layers hold: which of the project's packages a package may import (docs/architecture.md), and
no import cycle between modules. Read from the source (every `import`, at module level or inside a
function), so a lazy import cannot hide a wrong dependency."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("xclp", "crypto", "service", "clients", "cli", "xclp_flower")
MAY_IMPORT = {
    "crypto": {"crypto"},
    "xclp": {"xclp", "crypto"},
    "service": {"service", "xclp", "crypto"},
    "clients": {"clients", "xclp", "crypto"},
    "xclp_flower": {"xclp_flower", "clients", "xclp", "crypto"},  # a third driver, beside service/ and clients/
    "cli": set(PACKAGES),
}


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(path: Path, module: str, top_level_only: bool = False) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = tree.body if top_level_only else ast.walk(tree)
    names = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the importing module's package
                base = module.split(".")[: -node.level] if not path.name == "__init__.py" else module.split(".")
                names.add(".".join(base + ([node.module] if node.module else [])))
            elif node.module:
                names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


def test_each_package_imports_only_the_layers_below_it():
    wrong = []
    for module, path in _modules().items():
        pkg = module.split(".")[0]
        for name in _imports(path, module):
            other = name.split(".")[0]
            if other in PACKAGES and other not in MAY_IMPORT[pkg]:
                wrong.append(f"{module} imports {name}")
    assert not wrong, "imports across the layers:\n" + "\n".join(sorted(wrong))


def test_the_core_imports_no_driver_library():
    """The protocol, training, privacy and crypto code (xclp/, crypto/) runs the same under every driver:
    no command line, web framework, HTTP client, Flower or plotting inside it (those are cli/'s,
    service/'s, clients/' and xclp_flower/'s)."""
    drivers = {"argparse", "fastapi", "starlette", "uvicorn", "httpx", "flwr", "matplotlib"}
    wrong = [f"{m} imports {n}" for m, p in _modules().items() if m.split(".")[0] in ("xclp", "crypto")
             for n in sorted(_imports(p, m)) if n.split(".")[0] in drivers]
    assert not wrong, "\n".join(wrong)


def test_no_import_cycle_between_modules():
    """Counting the imports inside functions too: a lazy import hides a cycle from the interpreter,
    not from the design."""
    mods = _modules()
    graph = {m: {n for n in _imports(p, m) if n in mods and n != m} for m, p in mods.items()}
    # Importing a package's submodule imports the package itself, but no edge needs adding for that:
    # the __init__ modules here import nothing of their siblings.
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state and (cycle := visit(n)):
                return cycle
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (cycle := visit(m)):
            raise AssertionError("import cycle: " + " -> ".join(cycle))


def test_the_layer_check_sees_a_wrong_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from service.app import create_app\n")
    assert "service.app" in _imports(bad, "xclp.bad")


def test_a_long_module_says_at_its_top_why_it_is_long():
    long = []
    for module, path in _modules().items():
        text = path.read_text()
        if text.count("\n") > 500 and "lines" not in (ast.get_docstring(ast.parse(text)) or "")[:400]:
            long.append(f"{module} ({text.count(chr(10))} lines)")
    assert not long, "modules over 500 lines with no reason stated at the top: " + ", ".join(long)
