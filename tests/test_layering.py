"""The shard's layering, read from its source: platforms own the device (no device-type check
outside shard/platforms/), imports run down the layers (models -> layers -> platforms' ops),
and no import cycle, counting the imports made inside functions too."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SHARD = Path(__file__).resolve().parents[1] / "shard"
# What decides by device: a tensor's or device's type, CUDA's API, the native kernels' eager
# gate, triton's interpreter switch.
DEVICE_CHECK = re.compile(
    r"\.device\.type\b|\.is_cuda\b|torch\.cuda\.|\.type\s*[!=]=\s*[\"'](cpu|cuda)[\"']"
    r"|eager_cpu_kernel|interpreting\(\)"
)


def _modules() -> dict[str, Path]:
    found = {}
    for path in SHARD.rglob("*.py"):
        parts = path.relative_to(SHARD.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The shard modules `name` imports at run time (at module level or inside functions; not
    under TYPE_CHECKING), leaving out its own parent packages (Python runs those first)."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for statement in block.body
        for node in ast.walk(statement)
    }
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only or not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                package = package[: len(package) - node.level + 1]
                base = ".".join(package + ([base] if base else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(f"{target}."):
                found.add(target)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def test_no_device_type_check_outside_the_platforms():
    found = [
        f"{path.relative_to(SHARD.parent)}:{number}: {line.strip()}"
        for name, path in MODULES.items()
        if not name.startswith("shard.platforms")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if DEVICE_CHECK.search(line.split("#", 1)[0])
    ]
    assert found == []


@pytest.mark.parametrize(
    ("lower", "upper"),
    [
        ("shard.layers", ("shard.models", "shard.runner", "shard.server", "shard.startup")),
        ("shard.models", ("shard.runner", "shard.server", "shard.startup")),
        ("shard.attention", ("shard.layers", "shard.models", "shard.runner")),
    ],
)
def test_imports_run_down_the_layers(lower, upper):
    upward = sorted(
        f"{name} -> {target}"
        for name, targets in GRAPH.items()
        if name == lower or name.startswith(f"{lower}.")
        for target in targets
        if target.startswith(upper)
    )
    assert upward == []


# The operations the layers call and the kernels behind them sit below every layer; the
# platform's whole-model accelerations (the CPU decode loop, --compile, CUDA graphs) wrap a
# model and so may import it.
PLATFORM_OPS = ("shard.platforms.base", "shard.platforms.host_memory", "shard.platforms.cpu.native",
                "shard.platforms.cuda.kernels")  # fmt: skip


def test_platform_operations_import_no_layer_or_model():
    ops = [n for n in GRAPH if n == "shard.platforms" or n.startswith(PLATFORM_OPS)]
    ops += [n for n in ("shard.platforms.cpu", "shard.platforms.cuda") if n in GRAPH]
    upward = sorted(
        f"{name} -> {target}"
        for name in ops
        for target in GRAPH[name]
        if target.startswith(("shard.layers", "shard.models", "shard.runner", "shard.lora"))
    )
    assert upward == []


def test_no_import_cycles():
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in GRAPH[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in GRAPH:
        if node not in index:
            visit(node)
    assert cycles == []
