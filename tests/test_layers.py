"""The import structure of DESIGN.md ("Layers — what may import what"): the import-linter
contracts of pyproject.toml hold, no lcjax module is in an import cycle, imports inside
functions are kept for optional third-party packages only, and package ``__init__``s are
lazy, so ``import lcjax.nn`` loads no data, train or eval module and none of the heavy
optional packages.

The graph is grimp's (import-linter's): it holds every import statement, at module level
or inside a function. A lazy package (``lcjax.lazy``) imports its submodules on first
attribute access, which grimp cannot see; the cycle check adds those edges (package ->
each module of its ``_EXPORTS`` table)."""

from __future__ import annotations

import ast
import importlib
import json
import os
import pathlib
import subprocess
import sys
import tomllib

import pytest

grimp = pytest.importorskip("grimp")
pytest.importorskip("importlinter")

ROOT = pathlib.Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(
    [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}

# function-level lcjax imports that stay: importer -> why
FUNCTION_LEVEL_ALLOWED = {
    "lcjax.serve.cli": "lcjax.serve.app needs fastapi (the serve extra); `lcjax serve --help` "
                       "and the other subcommands run without it",
    "lcjax.bench.serve": "lcjax.serve needs fastapi (the serve extra); `lcjax bench attention` "
                         "runs without it",
    "lcjax.bench.context_parallel": "its worker subprocess sets XLA_FLAGS (the host device "
                                    "count) before jax is first imported",
    "lcjax.attention.plash": "the Pallas kernel module (jax.experimental.pallas) is imported "
                             "when a kernel call is dispatched, as resolve_kernel does for the "
                             "other kernels, not by `import lcjax.attention`",
}

HEAVY = ("grain", "orbax", "sentencex", "fastapi", "uvicorn")
UPPER = ("lcjax.data", "lcjax.train", "lcjax.eval", "lcjax.interop", "lcjax.serve",
         "lcjax.agents", "lcjax.tools", "lcjax.selection", "lcjax.analysis", "lcjax.bench")


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def _graph():
    return grimp.build_graph("lcjax", "pallas_kernels", cache_dir=None)


def test_import_linter_contracts_are_kept():
    code = ("import sys; from importlinter.cli import lint_imports; "
            "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, "
            "no_logo=True))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert "BROKEN" not in out.stdout and "KEPT" in out.stdout


def test_the_layers_contract_places_every_lcjax_package():
    """A new top-level module or package of lcjax must be given its layer."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in config["contracts"] if c["type"] == "layers")["layers"]
    placed = {name.strip().strip("()") for layer in layers for name in layer.split("|")}
    found = {f"lcjax.{p.stem if p.is_file() else p.name}" for p in (ROOT / "lcjax").iterdir()
             if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()}
    assert found <= placed, sorted(found - placed)


def test_the_graph_holds_imports_inside_functions():
    """The contracts would be blind to function-level imports if grimp skipped them: it does
    not (``lcjax.serve.cli`` imports ``lcjax.serve.app`` only inside functions)."""
    tree = ast.parse((ROOT / "lcjax/serve/cli.py").read_text())
    top = {n.module for n in tree.body if isinstance(n, ast.ImportFrom)}
    assert "lcjax.serve.app" not in top
    assert _graph().direct_import_exists(importer="lcjax.serve.cli", imported="lcjax.serve.app")


def _lazy_edges() -> dict[str, set[str]]:
    """Package -> the modules its lazy ``_EXPORTS`` table names (read in a subprocess)."""
    out = _run("import importlib, json, pkgutil, lcjax\n"
               "names = ['lcjax'] + [m.name for m in pkgutil.walk_packages(lcjax.__path__, "
               "'lcjax.') if m.ispkg]\n"
               "print(json.dumps({n: sorted(set(getattr(importlib.import_module(n), "
               "'_EXPORTS', {}).values())) for n in names}))")
    return {k: set(v) for k, v in json.loads(out.splitlines()[-1]).items()}


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the directed graph ``edges`` (iterative DFS), or None."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    for start in sorted(edges):
        if state.get(start):
            continue
        stack, path = [(start, iter(sorted(edges.get(start, ()))))], [start]
        state[start] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = 2
                stack.pop()
                path.pop()
            elif state.get(child) == 1:
                return path[path.index(child):] + [child]
            elif not state.get(child):
                state[child] = 1
                stack.append((child, iter(sorted(edges.get(child, ())))))
                path.append(child)
    return None


def test_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "d": {"a", "c"}}) is None


def test_no_import_cycles_among_lcjax_modules():
    graph = _graph()
    edges = {m: {t for t in graph.find_modules_directly_imported_by(m)
                 if t.split(".")[0] in ("lcjax", "pallas_kernels")} for m in graph.modules}
    for package, modules in _lazy_edges().items():
        edges.setdefault(package, set()).update(modules)
    assert _cycle(edges) is None, " -> ".join(_cycle(edges))


def _function_level_imports(path: pathlib.Path) -> list[tuple[int, str]]:
    found = []

    def visit(node, in_fn):
        for child in ast.iter_child_nodes(node):
            inside = in_fn or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if in_fn and isinstance(child, ast.ImportFrom) and (child.module or "").startswith(
                    ("lcjax", "pallas_kernels")):
                found.append((child.lineno, child.module))
            elif in_fn and isinstance(child, ast.Import):
                found.extend((child.lineno, a.name) for a in child.names
                             if a.name.startswith(("lcjax", "pallas_kernels")))
            visit(child, inside)

    visit(ast.parse(path.read_text()), False)
    return found


def test_lcjax_imports_inside_functions_only_for_optional_dependencies():
    bad = []
    for path in sorted((ROOT / "lcjax").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(
            ".__init__")
        if module in FUNCTION_LEVEL_ALLOWED:
            continue
        bad += [f"{module}:{line} imports {target}"
                for line, target in _function_level_imports(path)]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("statement", ["import lcjax", "import lcjax.nn"])
def test_importing_the_core_loads_no_upper_layer_nor_heavy_package(statement):
    out = _run(f"{statement}\nimport sys\n"
               "print(sorted(m for m in sys.modules))")
    loaded = set(ast.literal_eval(out.splitlines()[-1]))
    assert not [m for m in loaded if m.startswith(UPPER)], statement
    assert not [m for m in HEAVY if m in loaded], statement


def test_the_language_model_loads_no_training_evaluation_or_heavy_package():
    out = _run("from lcjax.nn import Attention, ContextLM, DecoderLM, generate, generate_blocks\n"
               "import sys\nprint(sorted(sys.modules))")
    loaded = set(ast.literal_eval(out.splitlines()[-1]))
    upper = [m for m in loaded if m.startswith(tuple(p for p in UPPER if p != "lcjax.data"))]
    assert not upper
    assert not [m for m in HEAVY if m in loaded]


def test_lazy_exports_resolve_and_match_all():
    """Every name of every lazy package's table is defined where the table says, and
    ``__all__`` lists exactly the table."""
    for package, modules in _lazy_edges().items():
        if not modules:
            continue
        pkg = importlib.import_module(package)
        assert sorted(pkg.__all__) == sorted(pkg._EXPORTS), package
        for name, module in pkg._EXPORTS.items():
            assert getattr(importlib.import_module(module), name) is getattr(pkg, name), (
                package, name)


def test_builtin_suites_are_listed_once_and_load_in_any_order():
    """The built-in suites come from ``BUILTIN_SUITES`` alone: importing the registry
    imports no generator, and each suite resolves whatever was imported before it."""
    out = _run("import sys\nfrom lcjax.data import suites\n"
               "print(sorted(m for m in sys.modules if m.startswith('lcjax.data.')))")
    assert ast.literal_eval(out.splitlines()[-1]) == ["lcjax.data.suites"]
    from lcjax.data import suites

    assert set(suites.BUILTIN_SUITES) <= set(suites.suites())
    for name in reversed(sorted(suites.BUILTIN_SUITES)):
        module, factory, _ = suites.BUILTIN_SUITES[name]
        assert callable(getattr(importlib.import_module(module), factory)), name
    for name in ("tablelong", "temporal_order", "ruler", "nolima"):
        assert suites.get_suite(name).name == name
    assert [o.flag for o in suites.suite_options("mgal")] == ["--langs"]
