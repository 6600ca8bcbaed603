"""MkDocs hooks (mkdocs.yml `hooks:`): generated pages for the docs site.

At build time, never committed: the home page from README.md, the CLI reference from the typer
app, the configuration reference from the YAML files the core and the installed plugins ship, an
overview of the packages and one page per plugin package from its README. New packages, commands
and config keys appear without editing anything here or in mkdocs.yml; so do new pages under
docs/ that mkdocs.yml's `nav` does not list (they join "Guides").
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

TOOLS = Path(__file__).resolve().parent
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))

import reference  # noqa: E402
import release  # noqa: E402

GUIDES = "Guides"
PACKAGES = "Packages"


def _plugins() -> list[Any]:
    return [p for p in release.packages() if not p.is_core]


def _listed(nav: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(nav, str):
        found.add(nav)
    elif isinstance(nav, list):
        for item in nav:
            found |= _listed(item)
    elif isinstance(nav, dict):
        for value in nav.values():
            found |= _listed(value)
    return found


def _section(nav: list, title: str) -> list:
    for item in nav:
        if isinstance(item, dict) and title in item and isinstance(item[title], list):
            return item[title]
    section: list = []
    nav.append({title: section})
    return section


def on_config(config: Any) -> Any:
    nav = config["nav"]
    if nav is None:
        return config
    listed = _listed(nav)
    guides = _section(nav, GUIDES)
    docs_dir = Path(config["docs_dir"])
    for page in sorted(docs_dir.rglob("*.md")):
        rel = page.relative_to(docs_dir).as_posix()
        if rel not in listed:
            guides.append(rel)
    packages = _section(nav, PACKAGES)
    for pkg in _plugins():
        rel = f"packages/{reference.package_slug(pkg.name)}.md"
        if rel not in listed:
            packages.append({pkg.name: rel})
    return config


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    pages = {
        "index.md": reference.readme_as_index((release.REPO / "README.md").read_text()),
        "reference/cli.md": reference.cli_reference(),
        "reference/config.md": reference.config_reference(),
        "packages/index.md": reference.packages_page(),
    }
    for pkg in _plugins():
        pages[f"packages/{reference.package_slug(pkg.name)}.md"] = reference.package_page(pkg)
    for src_uri, content in pages.items():
        if files.get_file_from_path(src_uri) is not None:
            raise SystemExit(f"docs/{src_uri} exists but is generated at build time: remove it")
        files.append(File.generated(config, src_uri, content=content))
    return files
