"""The Makefile's developer loops cost only what they need.

``make demo`` and ``make check`` need neither the Spark extra (a 456 MB
pyspark) nor selenium; running a subset of the tests needs none of ``make
test``'s chromium, lint and docs; and the demo's scripted users import
websocket-client, which the demo's extra must bring. ``make -n`` shows what
a target would run on a fresh checkout (a virtualenv path that does not
exist yet), without running it.
"""

import ast
import importlib.metadata
import os
import re
import subprocess
import sys

import pytest
from packaging.requirements import Requirement

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _dry_run(tmp_path, *args):
    """The commands ``make -n ARGS`` prints, for a virtualenv not made yet."""
    # Not a sub-make of the make that may run these tests (make check).
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    done = subprocess.run(
        ["make", "-n", "--no-print-directory", "VENV=%s" % (tmp_path / "venv"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_quick_loop_runs_pytest_and_nothing_else(tmp_path):
    commands = _dry_run(tmp_path, "quick", "PYTEST_ARGS=-k groups").strip().splitlines()
    assert len(commands) == 1, commands
    assert re.search(r"/bin/python -m pytest -k groups$", commands[0]), commands


def test_the_demo_installs_the_channels_extra_only(tmp_path):
    commands = _dry_run(tmp_path, "demo")
    installs = re.findall(r"pip install (.*)", commands)
    assert installs == ["-e '.[channels]'"], commands
    for other in ("browser", "sphinx", "ruff", "mypy", "spark"):
        assert other not in commands, commands
    assert "examples/chat_demo.py" in commands


def test_the_quick_tier_installs_neither_spark_nor_a_browser(tmp_path):
    """``make check`` (and the lint it runs) installs the test extra and
    Twisted (for mypy) alone; ``make test`` still installs Spark and selenium
    for the tests that use them."""
    installs = re.findall(r"pip install (.*)", _dry_run(tmp_path, "check"))
    assert installs == ["-e '.[test,twisted]'"], installs
    _, extras = _setup_requirements()
    light = {_normalized(Requirement(r).name) for r in extras["test"] + extras["twisted"]}
    assert not {"pyspark", "selenium"} & light
    installs = re.findall(r"pip install (.*)", _dry_run(tmp_path, "test"))
    assert "-e '.[test,spark,channels,browser]'" in installs, installs


def _setup_requirements():
    """(install_requires, extras_require) as setup.py writes them."""
    with open(os.path.join(ROOT, "setup.py"), encoding="utf8") as handle:
        tree = ast.parse(handle.read())
    (call,) = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setup"
    ]
    keywords = {k.arg: k.value for k in call.keywords}
    return (
        ast.literal_eval(keywords["install_requires"]),
        ast.literal_eval(keywords["extras_require"]),
    )


def _closure(requirements):
    """The normalized names of the distributions ``requirements`` bring, transitively."""
    seen = set()
    todo = [Requirement(text) for text in requirements]
    while todo:
        requirement = todo.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        name = _normalized(requirement.name)
        if name in seen:
            continue
        seen.add(name)
        try:
            todo.extend(Requirement(text) for text in importlib.metadata.requires(name) or ())
        except importlib.metadata.PackageNotFoundError:
            pass
    return seen


def _normalized(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def _imported_top_level_modules(path):
    with open(path, encoding="utf8") as handle:
        tree = ast.parse(handle.read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found


def _python_files(*relative):
    for name in relative:
        path = os.path.join(ROOT, name)
        if os.path.isfile(path):
            yield path
            continue
        for directory, _, files in os.walk(path):
            yield from (os.path.join(directory, f) for f in files if f.endswith(".py"))


@pytest.mark.extras
def test_the_chat_demo_needs_only_the_channels_extra():
    """What examples/chat_demo.py and the chat project it runs import comes
    with ``pip install '.[channels]'``."""
    project = os.path.join(ROOT, "tests", "project")
    examples = os.path.join(ROOT, "examples")
    local = {"asgi_amqp", "devtools"} | {
        os.path.splitext(name)[0] for folder in (project, examples) for name in os.listdir(folder)
    }
    modules = set()
    demo = _python_files(
        "examples/chat_demo.py",
        "tests/project/chatstack.py",
        "tests/project/manage.py",
        "tests/project/chat",
        "tests/project/chatproject",
    )
    for path in demo:
        if "redis" not in os.path.basename(path):  # the benchmarks' asgi_redis settings
            modules |= _imported_top_level_modules(path)
    third_party = sorted(modules - local - set(sys.stdlib_module_names) - {"__future__"})
    assert "websocket" in third_party  # the scripted users' client is looked at
    core, extras = _setup_requirements()
    installed = _closure(core + extras["channels"])
    providers = importlib.metadata.packages_distributions()
    missing = {}
    for module in third_party:
        dists = {_normalized(d) for d in providers.get(module, [])}
        if not dists:
            pytest.fail("%s is imported by the demo but not installed here" % module)
        if not dists & installed:
            missing[module] = sorted(dists)
    assert not missing, "imported by the demo, not in the channels extra: %s" % missing
