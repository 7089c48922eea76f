"""The house's floors: the job contract imports none of the packages above it, and the
launcher, the trainer and the server are peers that import only the contract and themselves.
Read from the source with `ast` (every `import`, at any depth), so a function-level import
counts as much as a top-level one."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ("job", "container", "train", "serve", "sagemaker_ops", "bench", "scripts")
ALLOWED = {
    "job": {"job"},
    "container": {"job", "container"},
    "train": {"job", "train"},
    "serve": {"job", "serve"},
}


def imported_modules(path: Path) -> set[str]:
    """The dotted names of the modules `path` imports."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def project_imports(path: Path) -> set[str]:
    return {name for name in imported_modules(path) if name.split(".")[0] in PROJECT}


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_a_package_imports_only_the_floors_below_it(package):
    wrong = sorted(
        f"{path.relative_to(ROOT)} imports {name}"
        for path in sorted((ROOT / package).rglob("*.py"))
        for name in project_imports(path)
        if name.split(".")[0] not in ALLOWED[package]
    )
    assert not wrong, "\n".join(wrong)


def test_no_import_cycle_between_modules():
    paths = [p for package in ALLOWED for p in sorted((ROOT / package).rglob("*.py"))]
    modules = {module_name(p): p for p in paths}
    graph = {
        name: {m for m in project_imports(path) if m in modules and m != name}
        for name, path in modules.items()
    }
    state: dict[str, str] = {}

    def visit(name: str, trail: list[str]) -> None:
        state[name] = "open"
        for target in sorted(graph[name]):
            if state.get(target) == "open":
                cycle = (
                    trail[trail.index(target) :] + [target] if target in trail else [name, target]
                )
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target, trail + [target])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_the_checker_sees_a_wrong_import(tmp_path):
    """The check above would catch the imports that used to run back up."""
    source = tmp_path / "plan.py"
    source.write_text("def f():\n    from train.batching import plan_batches\n")
    assert project_imports(source) == {"train.batching", "train.batching.plan_batches"}


def test_the_server_uses_gunicorn_only_through_its_documented_api():
    """serve/ builds on gunicorn's documented custom-application base and logger class only:
    its workers are the stock `gthread` ones, chosen by name; the slow-client deadline is kept
    by serve/intake.py in front of them, so no worker class, private module or undocumented
    attribute of gunicorn's is used."""
    used = {
        name
        for path in sorted((ROOT / "serve").rglob("*.py"))
        for name in imported_modules(path)
        if name.split(".")[0] == "gunicorn"
    }
    assert used <= {
        "gunicorn.app.base",
        "gunicorn.app.base.BaseApplication",
        "gunicorn.glogging",
        "gunicorn.glogging.Logger",
    }, sorted(used)
    source = "".join(path.read_text() for path in (ROOT / "serve").rglob("*.py"))
    assert ".unreader" not in source and "conn.sock" not in source
    assert not [name for name in used if name.rsplit(".", 1)[-1].startswith("_")]


def test_script_mode_hands_over_every_name_the_project_installs():
    """train/script_runner.py's list of our names must follow pyproject's package list."""
    import tomllib

    from train.script_runner import OUR_PACKAGES

    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"
    ]["find"]["include"]
    assert sorted(OUR_PACKAGES) == sorted(pattern.removesuffix("*") for pattern in include)
