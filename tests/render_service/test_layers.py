"""The packages depend on each other in one direction only (docs/architecture.md).

Every import statement is read from the source (also those inside functions and under
TYPE_CHECKING), so a lazy import cannot hide a crossing.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Package -> top-level names it must never import.
FORBIDDEN = {
    "render_service.protocol": ("render_service",),
    "render_service.model": (
        "render_service.render",
        "render_service.derender",
        "render_service.http",
        "render_service.multimodal",
    ),
    "render_service.apis": (
        "render_service.render",
        "render_service.derender",
        "render_service.http",
        "render_service.multimodal",
    ),
    "render_service.multimodal": (
        "render_service.render",
        "render_service.derender",
        "render_service.http",
    ),
    "render_service.render": ("render_service.derender", "render_service.http"),
    "render_service.derender": ("render_service.render", "render_service.http"),
    "render_service.library": ("render_service.http",),
    "parsers": ("render_service",),
}
# What a package may import despite a broader rule above.
ALLOWED = {"render_service.protocol": ("render_service.protocol",)}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Absolute names of every module ``path`` imports, relative imports resolved."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _sources(package: str) -> list[Path]:
    return sorted((REPO / package.replace(".", "/")).rglob("*.py"))


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_only_downward(package: str) -> None:
    sources = _sources(package)
    assert sources, f"no sources found for {package}"
    crossings = [
        f"{path.relative_to(REPO)} imports {name}"
        for path in sources
        for name in sorted(imports_of(path))
        if any(_within(name, bad) for bad in FORBIDDEN[package])
        and not any(_within(name, ok) for ok in ALLOWED.get(package, ()))
    ]
    assert crossings == []


def test_the_walker_sees_lazy_and_type_checking_imports() -> None:
    # The walker must find the imports the rules are about, or the test above proves nothing.
    handlers = imports_of(REPO / "render_service/http/handlers.py")
    assert "render_service.protocol.chat" in handlers
    server = imports_of(REPO / "render_service/http/server.py")
    assert "render_service.render" in server  # imported inside create_app
    chat = imports_of(REPO / "render_service/render/chat.py")
    assert "render_service.render.renderer" in chat  # under TYPE_CHECKING
