"""No module of the package imports itself back through other modules.

A cycle makes the import order matter (a name imported from a module that
is still half-initialised) and joins modules that are meant to be read
apart. The graph is grimp's (import-linter's): every import, those inside
functions too, except those under ``if TYPE_CHECKING:``, which only
annotations use and which never run. No broker is needed.
"""

from typing import Dict, List, Set

import grimp

PACKAGE = "asgi_amqp"


def _graph() -> grimp.ImportGraph:
    return grimp.build_graph(PACKAGE, exclude_type_checking_imports=True, cache_dir=None)


def _cycles(graph: grimp.ImportGraph) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan's)."""
    imports: Dict[str, Set[str]] = {
        module: graph.find_modules_directly_imported_by(module) for module in graph.modules
    }
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(imports[module]):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(imports):
        if module not in index:
            visit(module)
    return found


def _described(graph: grimp.ImportGraph, component: List[str]) -> str:
    members = set(component)
    lines = []
    for importer in component:
        for imported in sorted(graph.find_modules_directly_imported_by(importer) & members):
            for detail in graph.get_import_details(importer=importer, imported=imported):
                lines.append(
                    "  %s:%d %s" % (importer, detail["line_number"], detail["line_contents"])
                )
    return "\n".join(lines)


def test_no_module_imports_itself_through_others():
    graph = _graph()
    assert "%s.engine.engine" % PACKAGE in graph.modules  # the whole package was read
    cycles = _cycles(graph)
    assert cycles == [], "import cycles:\n" + "\n\n".join(_described(graph, c) for c in cycles)


def test_a_cycle_is_found():
    """The check itself: one import upward (errors -> layer) makes a cycle it names."""
    graph = _graph()
    graph.add_import(importer="%s.errors" % PACKAGE, imported="%s.layer" % PACKAGE)
    cycles = _cycles(graph)
    assert len(cycles) == 1
    assert {"%s.errors" % PACKAGE, "%s.layer" % PACKAGE} <= set(cycles[0])
