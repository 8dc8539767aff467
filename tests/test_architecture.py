"""The rules of the code's layout (docs/architecture.md), checked on the source.

A method is three rooms: ``strategies/<name>.py`` (server), ``clients/<name>.py`` (client) and
``fedgraphcore/protocols/<name>.py`` or ``fedgraphcore/protocols/<name>/`` (its math and wire spec);
the rest of the core package ``fedgraphcore/`` is the library they share, and ``app/`` on top composes
them into the Flower app. Imports are read from the syntax tree, those inside functions included, so
a deferred import cannot slip past.
Each rule's assertion message lists every offender.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest


from app import registry
from fedgraphcore.config import ConfigView, NoiseConfig, SecAggConfig, SharedConfig

ROOT = Path(__file__).resolve().parents[1]
MAX_FUNCTION_LINES = 50

#: What a protocol module may not import: the transport, Flower, the server and client rooms.
PROTOCOL_FORBIDDEN = ("fedgraphcore.transport", "fedgraphcore.session", "app.inprocess", "app.server_app", "app.client_app",
                      "flwr", "strategies", "clients")
#: Modules the ClientApp must not import when it loads: a SuperNode starts a fresh ClientApp process
#: for every message, so they would be paid on every message (the steps that use them import them).
HEAVY_MODULES = ("torch", "sklearn", "matplotlib", "pandas", "scipy.stats")


def python_files(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, module) of every import in ``path``, anywhere in the file; ``from a import b`` gives
    both ``a`` and ``a.b`` (b may be a module), relative imports resolved against the file's package."""
    package = module_name(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found.append((node.lineno, module))
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names if alias.name != "*"]
    return found


def is_within(module: str, prefixes) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def forbidden_imports(files, prefixes) -> list[str]:
    """``file:line imports module``, once per import statement (its first forbidden module)."""
    found: dict[tuple[str, int], str] = {}
    for path in files:
        for line, module in imported_modules(path):
            if is_within(module, prefixes):
                found.setdefault((str(path.relative_to(ROOT)), line), module)
    return [f"{file}:{line} imports {module}" for (file, line), module in found.items()]


def long_functions(files) -> list[str]:
    """``file:line name (N lines)`` of every function or method longer than MAX_FUNCTION_LINES,
    its docstring not counted (numpydoc sections make a public function's docstring long)."""
    out = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                first = node.body[0]
                if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(
                        first.value.value, str):
                    lines -= first.end_lineno - first.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    out.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    return out


def all_views() -> list[type[ConfigView]]:
    """Every ConfigView subclass defined by the app's modules the registry imports (not a test's)."""
    found, todo = [], [ConfigView]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in found:
                found.append(sub)
                todo.append(sub)
    return [view for view in found if view.__module__.startswith(("fedgraphcore.", "app.", "strategies.", "clients."))]


# -- the helpers above ---------------------------------------------------------------------------
def test_imports_are_found_in_functions_and_relative_ones_resolved(tmp_path):
    sample = tmp_path / "fedgraphcore" / "protocols" / "sample.py"
    sample.parent.mkdir(parents=True)
    sample.write_text("def step():\n    from fedgraphcore import transport\n    import flwr.app\n"
                      "from . import fedkmeans\nfrom ..wire import ReplySpec\n")
    found = imported_modules(sample, tmp_path)
    assert (2, "fedgraphcore.transport") in found and (3, "flwr.app") in found
    assert (4, "fedgraphcore.protocols.fedkmeans") in found and (5, "fedgraphcore.wire") in found
    assert is_within("flwr.app", PROTOCOL_FORBIDDEN) and not is_within("fedgraphcore.transporter", PROTOCOL_FORBIDDEN)


# -- (a) a client never imports the server room ------------------------------------------------
def test_clients_never_import_strategies():
    offenders = forbidden_imports(python_files("clients"), ("strategies",))
    assert not offenders, "clients import the server room: " + "; ".join(offenders)


def test_clients_refuse_with_the_project_s_errors_not_a_bare_value_error():
    """A request a client refuses is the server's fault (ProtocolError) or the member's setting
    (ConfigError); a bare ValueError would be reported as a bug in the client."""
    offenders = [f"{path.relative_to(ROOT)}:{node.lineno}" for path in python_files("clients")
                 for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)
                 and getattr(node.exc.func, "id", None) == "ValueError"]
    assert offenders == []


# -- (b) a protocol module imports no transport --------------------------------------------------
def test_protocol_modules_import_no_transport_server_or_client():
    offenders = forbidden_imports(python_files("fedgraphcore/protocols"), PROTOCOL_FORBIDDEN)
    assert not offenders, "protocol modules import the transport or another room: " + "; ".join(offenders)


# -- (c) one typed view per method, every key declared once with its kind -------------------------
def test_a_strategy_and_its_client_read_the_same_settings_view():
    differ = [f"{name}: {e.strategy.__name__}.settings = {e.strategy.settings.__name__}, "
              f"{e.client.__name__}.settings = {e.client.settings.__name__}"
              for name, e in registry.STRATEGIES.items() if e.strategy.settings is not e.client.settings]
    assert not differ, "; ".join(differ)


def test_every_param_of_a_strategy_is_a_field_of_its_settings_view_with_its_kind():
    """Own keys in the strategy's ``settings``; borrowed ones in the view of the strategy declaring them."""
    declared_by = {p.key: e.strategy for e in registry.STRATEGIES.values() for p in e.strategy.params}
    problems = []
    for name, entry in registry.STRATEGIES.items():
        cls = entry.strategy
        owned = [(p, cls.settings) for p in cls.params]
        borrowed = [(p, declared_by[p.key].settings) for p in cls.borrowed if p.key in declared_by]
        problems += [f"{name}: borrowed '{p.key}' is declared by no strategy" for p in cls.borrowed
                     if p.key not in declared_by]
        missing: dict[str, list[str]] = {}
        for param, view in owned + borrowed:
            fields = view.keys()
            if param.key not in fields:
                missing.setdefault(view.__name__, []).append(param.key)
            elif fields[param.key] is not param.kind:
                problems.append(f"{name}: '{param.key}' is {param.kind.__name__}, {view.__name__} reads it as "
                                f"{fields[param.key].__name__}")
        problems += [f"{name}: {len(keys)} keys are no field of {view} ({', '.join(keys)})"
                     for view, keys in missing.items()]
    assert not problems, "keys not read through their view: " + "; ".join(problems)


def test_every_field_of_every_view_is_a_declared_key_of_its_kind():
    params = registry.schema().params
    views = all_views()
    assert {SharedConfig, SecAggConfig} <= set(views)
    problems = []
    for view in views:
        for key, kind in view.keys().items():
            if key not in params:
                problems.append(f"{view.__name__} reads '{key}', which no Param declares")
            elif params[key].kind is not kind:
                problems.append(f"{view.__name__} reads '{key}' as {kind.__name__}; it is declared "
                                f"{params[key].kind.__name__}")
    assert not problems, "; ".join(problems)


def test_the_shared_view_covers_every_shared_key_but_secure_aggregation_s_and_the_noise_seed():
    shared = set(SharedConfig.keys())
    core = {p.key for p in registry.core_params()}
    assert core - shared == set(SecAggConfig.keys()) | set(NoiseConfig.keys()) == {*SecAggConfig.keys(),
                                                                                  "privacy.noise-seed"}
    assert [f.name for f in dataclasses.fields(SecAggConfig)] == ["scale", "bound"]


#: The modules that write a Param: fedgraphcore.config builds the views' (from their fields), the data's keys and the
#: node privacy policy's are read through no view.
PARAM_WRITERS = ("fedgraphcore/config.py", "fedgraphcore/data/params.py", "fedgraphcore/privacy/policy.py")


def param_calls(files) -> list[str]:
    """``path:line`` of every ``Param(...)`` call (``Param`` by name or as an attribute) in ``files``."""
    found = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and "Param" in (getattr(node.func, "id", None), getattr(node.func, "attr", None)):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_keys_are_written_as_params_only_where_no_view_declares_them():
    """A key a view reads is declared by the view's field alone, never by a second Param elsewhere."""
    calls = param_calls(python_files("fedgraphcore", "app", "strategies", "clients", "deploy", "scripts", "benchmarks"))
    assert calls, "the scan finds no Param call at all"
    offenders = [call for call in calls if not call.startswith(PARAM_WRITERS)]
    assert not offenders, "Params written outside " + ", ".join(PARAM_WRITERS) + ": " + "; ".join(offenders)


def test_a_strategy_declares_exactly_the_fields_of_the_view_it_names():
    problems = []
    for name, entry in registry.STRATEGIES.items():
        cls = entry.strategy
        expected = cls.settings.params() if "settings" in vars(cls) else ()
        if cls.params != expected:
            problems.append(f"{name}: params {[p.key for p in cls.params]}, its view's {[p.key for p in expected]}")
    assert not problems, "; ".join(problems)


def test_every_run_config_key_is_a_view_field_or_a_data_key_and_only_one_of_them():
    from fedgraphcore.data.params import DATA_PARAMS

    view_keys = [key for view in all_views() for key in view.keys()]
    data_keys = [p.key for p in DATA_PARAMS]
    assert len(set(view_keys)) == len(view_keys), "a key is a field of two views"
    assert set(view_keys).isdisjoint(data_keys)
    assert set(registry.schema().params) == set(view_keys) | set(data_keys)


def test_a_strategy_that_writes_params_or_a_view_field_without_setting_is_refused():
    from fedgraphcore.config import Param, setting
    from strategies.base import ClusteringStrategy

    with pytest.raises(TypeError, match="Twice writes params; declare its keys as fields of its settings view"):
        type("Twice", (ClusteringStrategy,), {"params": (Param("twice.x", int, 0, ""),)})

    @dataclasses.dataclass(frozen=True)
    class Bare(ConfigView):
        prefix = "bare"
        declared: int = setting(1, "declared")
        plain: int = 0

    with pytest.raises(TypeError, match=r"^Bare.plain is not declared with fedgraphcore.config.setting\(\)$"):
        Bare.params()


# -- (d) the ClientApp loads without the heavy libraries -------------------------------------------
def test_the_client_app_module_loads_without_torch_sklearn_or_matplotlib():
    code = ("import sys, app.client_app; "
            f"print(sorted(m for m in {HEAVY_MODULES!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


# -- (e) small functions ------------------------------------------------------------------------
def test_an_integration_marker_is_applied_where_it_is_named():
    """``make test-integration`` collects only the test modules that name an integration marker
    (conftest.pytest_ignore_collect): each is a decorator, ``pytestmark`` or a ``marks=`` of the module
    that names it, never a name another module imports."""
    from conftest import INTEGRATION_MARK

    applied = re.compile(r"^\s*(@pytest\.mark\.|pytestmark = )|marks=|item\.add_marker\(")
    misused = [f"{path.name}:{number}: {line.strip()}" for path in sorted((ROOT / "tests").glob("*.py"))
               for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
               if INTEGRATION_MARK.search(line) and not applied.search(line)]
    assert misused == []


def test_no_function_is_longer_than_50_lines():
    offenders = long_functions(python_files("fedgraphcore", "app", "strategies", "clients"))
    assert not offenders, f"functions over {MAX_FUNCTION_LINES} lines: " + "; ".join(offenders)


def test_every_error_the_app_raises_on_purpose_has_one_root():
    """The server and the command-line tools catch :class:`fedgraphcore.errors.FedGraphError` alone: every
    public exception class the code defines is one (its message one line, its exit code 2 or 1, or
    a command's own code). A private class (``_Name``) is a module's own control flow, caught where
    it is raised."""
    from fedgraphcore.errors import FedGraphError

    found = []
    for path in python_files("fedgraphcore", "app", "clients", "strategies", "deploy"):
        module = None
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                module = module or importlib.import_module(module_name(path))
                cls = getattr(module, node.name)
                if isinstance(cls, type) and issubclass(cls, BaseException):
                    found.append(cls)
    assert len(found) >= 15
    assert [f"{c.__module__}.{c.__name__}" for c in found if not issubclass(c, FedGraphError)] == []
    assert {c.exit_code for c in found} == {1, 2}


MAX_MODULE_LINES = 600


def test_every_module_is_under_600_lines():
    """A module a reader takes in whole: one topic, under MAX_MODULE_LINES lines."""
    long = [f"{p.relative_to(ROOT)} ({n})" for p in python_files("fedgraphcore", "app", "clients", "strategies", "deploy")
            if (n := len(p.read_text().splitlines())) >= MAX_MODULE_LINES]
    assert long == []


# -- (f) no import circles ---------------------------------------------------------------------
def import_graph(files) -> dict[str, set[str]]:
    """Module -> the project modules it imports (anywhere in the file): of ``from a import b``, the
    module ``a.b`` where it is one, else ``a``; a package's ``__init__`` only when it is named itself."""
    modules = {module_name(path): path for path in files}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        found = imported_modules(path)
        named = {module for _, module in found}
        for _, module in found:
            if module in modules and module != name and not any(
                    other.startswith(module + ".") and other in modules for other in named):
                graph[name].add(module)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected sets of more than one module (Tarjan's algorithm, iterative)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    members = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        members.append(member)
                        if member == node:
                            break
                    if len(members) > 1:
                        found.append(sorted(members))
    return found


def test_the_circle_finder_finds_a_planted_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_modules_import_each_other_in_a_circle():
    """The registry hands the layers below it what they need; helpers live in the module that
    owns them: no two modules of the project import each other, directly or around a circle."""
    graph = import_graph(python_files("fedgraphcore", "app", "strategies", "clients", "deploy"))
    assert len(graph) > 100
    assert circles(graph) == []


# -- (g) direct dependencies declared --------------------------------------------------------------
def test_every_package_the_code_imports_is_a_declared_dependency():
    """A module of ``app/``, ``deploy/``, ``strategies/`` or ``clients/`` imports only the standard
    library, the project and the distributions ``pyproject.toml`` declares (another package's
    dependency may change under it)."""
    import importlib.metadata
    import re
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    def name(requirement: str) -> str:
        return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower().replace("_", "-")

    declared = {name(req) for req in project["dependencies"]}
    for req in project["dependencies"]:  # what a declared extra brings (flwr[simulation]: ray)
        for extra in re.findall(r"\[([^\]]+)\]", req.split(";")[0]):
            declared |= {name(r) for r in importlib.metadata.requires(name(req)) or []
                         if re.search(rf"extra\s*==\s*['\"]{extra}['\"]", r)}
    providers = importlib.metadata.packages_distributions()
    found = {}
    for path in python_files("fedgraphcore", "app", "deploy", "strategies", "clients"):
        for _, module in imported_modules(path):
            top = module.split(".")[0]
            if top in sys.stdlib_module_names or top in ("fedgraphcore", "app", "deploy", "strategies", "clients", ""):
                continue
            dists = {d.lower().replace("_", "-") for d in providers.get(top, [top])}
            if not dists & declared:
                found.setdefault(top, str(path.relative_to(ROOT)))
    assert found == {}, f"imported but not declared in pyproject.toml: {found}"


# -- (h) the layers: every arrow points down ---------------------------------------------------------
#: The top-level packages from the bottom up; a package imports only its own layer's and those below,
#: and ``strategies/`` and ``clients/`` (one layer) never each other.
LAYERS = (("fedgraphcore",), ("strategies", "clients"), ("app",), ("deploy",), ("benchmarks", "scripts"))


def layer_of(module: str) -> int | None:
    top = module.split(".")[0]
    return next((i for i, layer in enumerate(LAYERS) if top in layer), None)


def upward_imports(root: Path = ROOT) -> list[str]:
    """``file:line imports module`` of every import of a package on a higher layer, or of the
    other package on the same one (strategies/ <-> clients/), in the tree at ``root``."""
    found: dict[tuple[str, int], str] = {}
    for i, layer in enumerate(LAYERS):
        for top in layer:
            above = [p for higher in LAYERS[i + 1:] for p in higher] + [p for p in layer if p != top]
            for path in sorted((root / top).rglob("*.py")):
                for line, module in imported_modules(path, root):
                    if is_within(module, above):
                        found.setdefault((str(path.relative_to(root)), line), module)
    return [f"{file}:{line} imports {module}" for (file, line), module in sorted(found.items())]


def test_the_layer_check_finds_an_import_that_runs_up(tmp_path):
    assert layer_of("fedgraphcore.data.parties") == 0 and layer_of("clients.base") == 1
    assert layer_of("app.registry") == 2 and layer_of("numpy") is None
    (tmp_path / "fedgraphcore").mkdir()
    (tmp_path / "fedgraphcore" / "data.py").write_text("def late():\n    from app import registry\n")
    (tmp_path / "clients").mkdir()
    (tmp_path / "clients" / "kmeans.py").write_text("from fedgraphcore import data\nimport strategies.base\n")
    assert upward_imports(tmp_path) == ["clients/kmeans.py:2 imports strategies.base",
                                        "fedgraphcore/data.py:2 imports app"]


def test_every_import_points_down_the_layers():
    """The core imports nothing of the Flower app above it; ``strategies/`` and ``clients/`` import the
    core only (not ``app/``); ``app/`` composes them; ``deploy/``, then ``benchmarks/`` and
    ``scripts/`` sit on top (docs/architecture.md)."""
    offenders = upward_imports()
    assert not offenders, "imports that run up a layer: " + "; ".join(offenders)


def package_graph(graph: dict[str, set[str]], depth: int) -> dict[str, set[str]]:
    """``graph`` with every module folded into its package ``depth`` names deep (fedgraphcore.data)."""
    fold = lambda m: ".".join(m.split(".")[:depth])  # noqa: E731
    out: dict[str, set[str]] = {}
    for module, targets in graph.items():
        out.setdefault(fold(module), set()).update(fold(t) for t in targets if fold(t) != fold(module))
    return out


def test_no_circle_between_the_parts_of_the_core():
    """Inside the core, its parts (``data``, ``privacy``, ``protocols``, ``report`` and the modules
    beside them) import each other one way only: no two of them around a circle."""
    graph = package_graph(import_graph(python_files("fedgraphcore")), 2)
    assert {"fedgraphcore.data", "fedgraphcore.protocols", "fedgraphcore.privacy"} <= set(graph)
    assert circles(graph) == []
    assert circles(package_graph(import_graph(python_files("app", "strategies", "clients", "deploy",
                                                           "fedgraphcore")), 1)) == []


# -- (i) nothing private crosses a module's border ---------------------------------------------------
PROJECT = ("fedgraphcore", "app", "strategies", "clients", "deploy")


def private_uses(files) -> list[str]:
    """``file:line name`` of every private name (``_x``, not ``__x__``) of a project module that another
    module imports (``from m import _x``) or reaches through the module or a class it imported (``m._x``)."""
    private = lambda name: name.startswith("_") and not name.startswith("__")  # noqa: E731
    found = []
    for path in files:
        tree = ast.parse(path.read_text(), str(path))
        imported: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PROJECT:
                found += [f"{path.relative_to(ROOT)}:{node.lineno} {node.module}.{a.name}" for a in node.names
                          if private(a.name)]
                imported |= {a.asname or a.name for a in node.names}
            elif isinstance(node, ast.Import):
                imported |= {a.asname or a.name.split(".")[0] for a in node.names if a.name.split(".")[0] in PROJECT}
        found += [f"{path.relative_to(ROOT)}:{node.lineno} {node.value.id}.{node.attr}" for node in ast.walk(tree)
                  if isinstance(node, ast.Attribute) and private(node.attr) and isinstance(node.value, ast.Name)
                  and node.value.id in imported]
    return found


def test_no_module_uses_another_modules_private_names():
    """A helper two modules share is public in the module that owns it (tests may reach inside)."""
    offenders = private_uses(python_files(*PROJECT, "benchmarks", "scripts"))
    assert not offenders, "private names used across modules: " + "; ".join(offenders)
