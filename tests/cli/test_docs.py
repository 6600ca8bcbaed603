"""Docs: every config key is documented, the references are generated from what is installed, and
the site builds in strict mode (broken links and missing anchors fail)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rlinf_cli.confdoc import config_files, parse

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))

import reference  # noqa: E402


def test_every_config_key_of_the_core_and_the_installed_plugins_has_a_comment():
    files = config_files()
    owners = {owner for owner, _ in files}
    assert "rlinf-cli" in owners and len(owners) > 1  # the core's and the plugins' files are all read
    missing = [f"{path}:{k.line}: '{k.key}' ({owner})" for owner, path in files for k in parse(path).undocumented()]
    assert not missing, "config keys without a comment (write `key: value  # what it means`):\n" + "\n".join(missing)


def test_every_config_key_of_every_package_in_the_repository_has_a_comment():
    # also the packages not installed in this environment (a simulator with its own virtualenv)
    files = reference.repository_config_files()
    assert files
    missing = [f"{path}:{k.line}: '{k.key}'" for _, path in files for k in parse(path).undocumented()]
    assert not missing, "config keys without a comment:\n" + "\n".join(missing)


def test_the_scaffolds_teach_commented_keys():
    for path in sorted((REPO / "templates" / "plugin").glob("*/*/conf/*/*.yaml")):
        assert parse(path).undocumented() == [], path


def test_a_key_without_a_comment_is_caught(tmp_path):
    f = tmp_path / "opt.yaml"
    f.write_text(
        "# A header describes the file, not the first key.\n"
        "first: 1\n"
        "second: 2               # trailing comment\n"
        "# comment lines right above a key document it\n"
        "third: [a, b]\n"
        "\n"
        "# a comment cut off by a blank line documents nothing\n"
        "\n"
        "fourth: 'x # not a comment'\n"
        "section:                # documented section\n"
        "  inner: true\n"
        "  listed:               # a block list\n"
        "    - 1\n"
        "    - 2\n"
        "  after_list: null\n"
        "name: opt\n")
    doc = parse(f)
    assert doc.description == "A header describes the file, not the first key."
    keys = {k.key: k for k in doc.keys}
    assert list(keys) == ["first", "second", "third", "fourth", "section", "section.inner", "section.listed",
                          "section.after_list", "name"]
    assert [k.key for k in doc.undocumented()] == ["first", "fourth", "section.inner", "section.after_list"]
    assert keys["third"].comment == "comment lines right above a key document it"
    assert keys["fourth"].value == "'x # not a comment'"
    assert keys["section"].section and not keys["section.inner"].section
    assert keys["name"].documented  # described by the core: the registered component's name


def test_cli_reference_is_generated_from_the_typer_app():
    import typer

    from rlinf_cli.cli import app

    md = reference.cli_reference()
    root = typer.main.get_command(app)
    ctx = root.context_class(root, info_name="rlinf")
    paths = [" ".join(p) for p, _, _ in reference._walk(root, ctx, ["rlinf"])]
    assert {"rlinf collect", "rlinf rl", "rlinf config show", "rlinf plugins list"} <= set(paths)
    for path in paths:
        assert f"`{path}`" in md, path
    assert "rlinf rl [OPTIONS] [KEY=VALUE]..." in md
    assert "rlinf config show [OPTIONS] STAGE [KEY=VALUE]..." in md
    assert "`--diff OLD[..NEW]`" in md and "`--algo <str>`" in md

    # a command added to the app shows up with no edit to the generator
    extra = typer.Typer()
    extra.command("frobnicate")(lambda: None)
    extra.command("other")(lambda: None)
    assert "`rlinf frobnicate`" in reference.cli_reference(extra)


def test_config_reference_documents_every_installed_key():
    from rlinf_cli.registry import GROUP_TO_KIND

    md = reference.config_reference()
    for owner, path in config_files():
        group = path.parent.name if path.parent.name in GROUP_TO_KIND else None
        for k in parse(path).keys:
            if k.key in ("name", "defaults") or path.name == "renamed.yaml":
                continue
            key = f"{group}.{k.key}" if group else k.key
            assert f"| `{key}` |" in md, (path, key)
        if group:
            assert f"`{group}={path.stem}`" in md and f"From `{owner}`" in md


def test_docs_site_builds_in_strict_mode(tmp_path):
    mkdocs = Path(sys.executable).with_name("mkdocs")
    if not mkdocs.exists():
        pytest.fail("mkdocs is not installed: make install installs the docs extra")
    res = subprocess.run([str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "WARNING -" not in res.stderr and "ERROR -" not in res.stderr
    site = tmp_path / "site"
    for page in ("index.html", "reference/cli/index.html", "reference/config/index.html", "packages/index.html",
                 "plugins/index.html", "benchmarks/index.html", "release/index.html"):
        assert (site / page).is_file(), page
    import release

    for pkg in release.packages():
        if not pkg.is_core:
            assert (site / "packages" / reference.package_slug(pkg.name) / "index.html").is_file(), pkg.name
    config_page = (site / "reference/config/index.html").read_text()
    plugin_keys = [f"{p.parent.name}.{k.key}" for owner, p in config_files() if owner != "rlinf-cli"
                   for k in parse(p).keys if k.key != "name"]
    assert plugin_keys and all(f"<code>{key}</code>" in config_page for key in plugin_keys)
