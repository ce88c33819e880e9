"""What a CPU user installs: the library imports and runs without triton and without the bench's
table and plotting libraries (extras: fusionplan[gpu], fusionplan[bench])."""

import pathlib
import subprocess
import sys

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = pathlib.Path(__file__).parents[1]

BLOCKER = """
import sys

class _Missing:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("triton", "rich", "matplotlib"):
            raise ImportError(f"No module named {name!r}")

sys.meta_path.insert(0, _Missing())
"""

USE = """
import torch
import fusionplan as fp
import fusionplan.miopen
import fusionplan.torch

x = torch.randn(1, 3, 8, 8)
plan = fp.Plan(x).conv(torch.randn(4, 3, 3, 3), padding=1).relu()
y = plan(x)
assert plan.solver == "cpu-folded", plan.solver
print(*plan.explain(), sep="\\n")
"""


def test_install_dependencies_are_what_the_cpu_path_needs():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {d.split(";")[0].split(">")[0].split("=")[0].strip() for d in project["dependencies"]}
    assert names == {"torch", "numpy"}
    assert any(d.startswith("triton") for d in project["optional-dependencies"]["gpu"])
    assert (ROOT / "LICENSE").is_file() and project["readme"] == "README.md"


def test_the_library_runs_without_triton_rich_or_matplotlib():
    out = subprocess.run([sys.executable, "-c", BLOCKER + USE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "triton-conv [triton]: no: " in out.stdout  # the Triton solvers say why, rather than fail


def _fusionplan_imports(module: str) -> set[str]:
    """The fusionplan modules ``module`` (a path under src/fusionplan) imports, at any depth of its code;
    ``from fusionplan import x`` counts as ``fusionplan.x``."""
    import ast

    tree = ast.parse((ROOT / "src" / "fusionplan" / module).read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "fusionplan":
            names.update(f"fusionplan.{a.name}" for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "fusionplan":
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.split(".")[0] == "fusionplan")
    return names


#: The package's layers, top to bottom, and the layers each may import. The frontends are the
#: package itself and the modules a user imports (fusionplan.miopen, fusionplan.torch, ...).
LAYER_IMPORTS = {
    "tools": {"tools", "frontends", "plan", "solvers", "runtime", "oracle", "core"},
    "frontends": {"frontends", "plan", "solvers", "runtime", "oracle", "core"},
    "plan": {"plan", "solvers", "runtime", "core"},
    "solvers": {"solvers", "runtime", "oracle", "core"},
    "runtime": {"runtime", "core"},
    "oracle": {"oracle", "core"},
    "core": {"core"},
}
FRONTENDS = {
    "api",
    "miopen",
    "miopen_objects",
    "torch",
    "torch_activations",
    "torch_op",
    "torch_graph",
    "torch_train",
    "compiling",
}


def _layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in FRONTENDS:
        return "frontends"
    assert parts[1] in LAYER_IMPORTS, f"{module} belongs to no layer"
    return parts[1]


def test_each_layer_imports_only_the_layers_below_it():
    package = ROOT / "src" / "fusionplan"
    wrong = []
    for path in sorted(package.rglob("*.py")):
        module = ".".join(path.relative_to(package.parent).with_suffix("").parts).removesuffix(".__init__")
        for imported in _fusionplan_imports(str(path.relative_to(package))):
            if _layer(imported) not in LAYER_IMPORTS[_layer(module)]:
                wrong.append(f"{module} ({_layer(module)}) imports {imported} ({_layer(imported)})")
    assert wrong == []
    assert {p.name for p in package.glob("*.py")} == {"__init__.py", "plan.py"} | {f"{m}.py" for m in FRONTENDS}


def test_imports_run_one_way_inside_the_core():
    """enums imports nothing of fusionplan, errors only enums, the random samples only descriptors,
    enums and operators; the perf database takes the version without importing the package; no
    solver imports the verification helpers (fusionplan.tools.verify)."""
    assert _fusionplan_imports("core/enums.py") == set()
    assert _fusionplan_imports("core/errors.py") == {"fusionplan.core.enums"}
    assert _fusionplan_imports("core/samples.py") <= {
        "fusionplan.core.enums",
        "fusionplan.core.ops",
        "fusionplan.core.descriptors",
    }
    assert "fusionplan" not in _fusionplan_imports("runtime/perfdb.py")


#: The modules of fusionplan.solvers that every solver may import: the base classes and the shared
#: convolution kernel, template and toolkits. The others hold one solver each.
SHARED_SOLVER_MODULES = {
    "__init__", "base", "conv_toolkit", "conv_kernel", "gluon_toolkit", "window_toolkit", "gather_toolkit",
    "stem_toolkit", "staged_toolkit", "folded_toolkit", "find",
}  # fmt: skip


def test_solver_modules_import_no_sibling():
    """A solver's module imports the shared modules and its own template (solvers/templates), never
    another solver's; the shared modules and the templates import no solver's."""
    solvers = ROOT / "src" / "fusionplan" / "solvers"
    pairs = set()
    for path in solvers.glob("*.py"):
        if path.stem in SHARED_SOLVER_MODULES:
            continue
        for module in _fusionplan_imports(f"solvers/{path.name}"):
            parts = module.split(".")
            if parts[:3] == ["fusionplan", "solvers", "templates"]:  # its own template only
                if parts[3:] != [path.stem]:
                    pairs.add((path.stem, module))
            elif parts[:2] == ["fusionplan", "solvers"] and len(parts) == 3 and parts[2] not in SHARED_SOLVER_MODULES:
                pairs.add((path.stem, parts[2]))
    assert pairs == set()
    shared = {f"solvers/{m}.py" for m in SHARED_SOLVER_MODULES - {"__init__"}}
    shared |= {f"solvers/templates/{p.name}" for p in (solvers / "templates").glob("*.py")}
    for module in shared:  # the shared modules import no solver
        below = {m.split(".")[2] for m in _fusionplan_imports(module) if m.startswith("fusionplan.solvers.")}
        assert below <= SHARED_SOLVER_MODULES, (module, below)


def test_kernel_classes_are_a_base_and_the_solvers_own():
    """Reading a solver's kernel means reading its class and at most one base of the solvers
    package (conv_kernel.TritonConvKernel), above base.Kernel."""
    import inspect

    import fusionplan.solvers as solvers
    from fusionplan.solvers.base import Kernel

    kernels = {
        cls
        for module in vars(solvers).values()
        if inspect.ismodule(module) and module.__name__.startswith("fusionplan.solvers.")
        for cls in vars(module).values()
        if inspect.isclass(cls) and issubclass(cls, Kernel) and cls is not Kernel
    }
    assert len(kernels) >= 18
    deep = {}
    for cls in kernels:
        chain = [c.__name__ for c in cls.__mro__ if c.__module__.startswith("fusionplan.solvers.") and c is not Kernel]
        if len(chain) > 2:
            deep[cls.__name__] = chain
    assert deep == {}


def test_the_house_stays_small():
    """No source file over 800 lines (a module that long does several things), and at most 400
    tracked files (git history keeps the rest)."""
    long = {
        str(p.relative_to(ROOT)): n
        for p in (ROOT / "src").rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 800
    }
    assert not long, long
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout")
    assert len(tracked.stdout.splitlines()) <= 400
