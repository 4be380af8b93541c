"""fp8comm's Python modules import one another without a circle (imports
inside functions included: hiding one there does not break the loop), so
each can be read and tested from the floor up (DESIGN.md, "Layout")."""
import ast

from tests.support import REPO_ROOT

PACKAGE = REPO_ROOT / "fp8comm"


def module_name(path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path) -> set:
    """The fp8comm modules `path` imports, anywhere in the file (the package
    itself and the extension _C left out: every module may use those)."""
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            if not base.startswith("fp8comm"):
                continue
            for alias in node.names:  # `from . import backend` names a module, `from .x import y` a name in x
                candidate = PACKAGE.parent / f"{base}.{alias.name}".replace(".", "/")
                is_module = candidate.with_suffix(".py").exists() or candidate.is_dir()
                found.add(f"{base}.{alias.name}" if is_module else base)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("fp8comm.")}
    return {m for m in found if m not in ("fp8comm", "fp8comm._C", here)}


def test_no_module_imports_in_a_circle():
    graph = {module_name(p): imports_of(p) for p in PACKAGE.rglob("*.py")}
    assert "fp8comm.registry" in graph and "fp8comm.registry" in graph["fp8comm.stats"]  # the parser sees imports
    state: dict = {}

    def visit(module, path):
        state[module] = "open"
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                raise AssertionError("import circle: " + " -> ".join(path[path.index(target):] + [target]))
            if target not in state:
                visit(target, path + [target])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
