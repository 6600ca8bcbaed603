"""Release tooling: find every package of this repository, build an sdist and a wheel for each with
the standard build front end, and check them the way an index and a user would see them.

    python tools/release.py list                    # the packages found (core + plugins*/*)
    python tools/release.py dist [--outdir dist]    # build all, then `check`
    python tools/release.py check [--outdir dist]   # twine check --strict + the checks below
    python tools/release.py names                   # is each distribution name still free on the index?
    python tools/release.py config-history          # store this version's defaults (rlinf config show --diff)

Packages are found, never listed: the core is the repository root, a plugin is any
``plugins*/<dir>/pyproject.toml``. A package added by another branch is built and checked with no
edit here. What is checked (``check_*`` below, also run by tests/cli/test_release.py):

- metadata: name and version as in pyproject.toml, a summary, a licence expression and file, a
  markdown README as the long description, classifiers, ``Requires-Python``;
- plugins depend on the core by its index name with a version range that contains the core's
  version and has an upper bound, never on ``rlinf`` (on the index that is another project), and
  declare an ``rlinf`` entry point;
- every file under the package's import directories (``conf/*.yaml`` above all) is in the wheel
  and in the sdist: a file left out breaks a plugin only for users, never in an editable install;
- each README (the package's index page) says what it adds, how to install it by name, an example
  and what was verified; plugin READMEs have no relative links (they break on the index page).
"""

from __future__ import annotations

import argparse
import ast
import email.parser
import os
import re
import subprocess
import sys
import tarfile
import time
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pip vendors the same parser
    from pip._vendor import tomli as tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README_SECTIONS = ("install", "example", "verified")  # `## ...` headings every package README has
SKIP_PARTS = {"__pycache__", ".pytest_cache"}
SKIP_SUFFIXES = {".pyc", ".pyo"}


@dataclass(frozen=True)
class Package:
    path: Path  # the directory holding pyproject.toml
    name: str  # distribution name, as on the index
    version: str
    pyproject: dict = field(repr=False, compare=False)
    is_core: bool = False  # the repository root: `rlinf_cli`, on which every plugin depends

    @property
    def is_library(self) -> bool:
        """A library plugins share (``[tool.rlinf] library = true``), not a plugin itself."""
        return bool(self.pyproject.get("tool", {}).get("rlinf", {}).get("library"))

    @property
    def artifact_stem(self) -> str:
        """``rlinf_sim_metaworld-0.1.0``: how wheel and sdist file names start."""
        return f"{normalize(self.name).replace('-', '_')}-{self.version}"

    def source_roots(self) -> dict[Path, str]:
        """Source directories whose every file must ship -> their path inside the wheel."""
        st = self.pyproject.get("tool", {}).get("setuptools", {})
        tops: set[str] = set()
        pkgs = st.get("packages")
        if isinstance(pkgs, list):
            tops.update(p.split(".")[0] for p in pkgs)
        elif isinstance(pkgs, dict) and "find" in pkgs:
            tops.update(pat.rstrip("*.") for pat in pkgs["find"].get("include", []))
        mapped = st.get("package-dir", {})
        roots = {self.path / top: top for top in sorted(tops) if (self.path / top).is_dir()}
        for dotted, src in mapped.items():
            if dotted:
                roots[self.path / src] = dotted.replace(".", "/")
        return roots


def normalize(name: str) -> str:
    """PEP 503 normalised name: what the index compares."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _load(path: Path, is_core: bool = False) -> Package:
    data = tomllib.loads((path / "pyproject.toml").read_text())
    project = data["project"]
    version = project.get("version")
    if version is None and "version" in project.get("dynamic", []):
        attr = data["tool"]["setuptools"]["dynamic"]["version"]["attr"]
        module, _, name = attr.rpartition(".")
        source = path / (module.replace(".", "/") + ".py")
        if not source.exists():
            source = path / module.replace(".", "/") / "__init__.py"
        for node in ast.parse(source.read_text()).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
                version = ast.literal_eval(node.value)
    if not version:
        raise SystemExit(f"{path}/pyproject.toml: no version")
    return Package(path, project["name"], str(version), data, is_core)


def packages(repo: Path = REPO) -> list[Package]:
    """The core (repository root) and every plugin package (``plugins*/*/pyproject.toml``)."""
    found = [_load(repo, is_core=True)]
    found += [_load(p.parent) for p in sorted(repo.glob("plugins*/*/pyproject.toml"))]
    return found


def core(pkgs: list[Package] | None = None) -> Package:
    return next(p for p in (pkgs or packages()) if p.is_core)


def source_files(pkg: Package) -> dict[str, Path]:
    """Every file the package ships from its import directories: wheel path -> source file.

    Files git does not track (build output, scratch files) are left out when this is a checkout.
    """
    tracked = _git_files(pkg.path)
    out: dict[str, Path] = {}
    for root, dest in pkg.source_roots().items():
        for f in sorted(root.rglob("*")):
            if f.is_dir() or SKIP_PARTS & set(f.relative_to(root).parts) or f.suffix in SKIP_SUFFIXES:
                continue
            if tracked is not None and f.resolve() not in tracked:
                continue
            out[f"{dest}/{f.relative_to(root).as_posix()}"] = f
    return out


def _git_files(path: Path) -> set[Path] | None:
    try:
        res = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             cwd=path, capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if res.returncode != 0:
        return None
    return {(path / f).resolve() for f in res.stdout.decode().split("\0") if f}


# -- building --------------------------------------------------------------------------------
def build(outdir: Path, pkgs: list[Package] | None = None, isolation: bool = True,
          python: str = sys.executable) -> list[Path]:
    """``python -m build`` (sdist, then the wheel from that sdist) for each package into outdir."""
    outdir.mkdir(parents=True, exist_ok=True)
    made: list[Path] = []
    for pkg in pkgs or packages():
        for old in outdir.glob(f"{pkg.artifact_stem}*"):
            old.unlink()
        t0 = time.time()
        cmd = [python, "-m", "build", "--outdir", str(outdir), *([] if isolation else ["--no-isolation"]), str(pkg.path)]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if res.returncode != 0:
            raise SystemExit(f"building {pkg.name} failed:\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}")
        warnings = [line for line in (res.stdout + res.stderr).splitlines() if "Warning" in line and "!!" not in line]
        if warnings:
            raise SystemExit(f"building {pkg.name} warned (fix the packaging):\n" + "\n".join(warnings))
        artifacts = sorted(outdir.glob(f"{pkg.artifact_stem}*"))
        made += artifacts
        print(f"built {pkg.name} {pkg.version}: {', '.join(a.name for a in artifacts)} ({time.time() - t0:.1f} s)")
    return made


# -- checking --------------------------------------------------------------------------------
def artifacts_of(pkg: Package, outdir: Path) -> tuple[Path | None, Path | None]:
    wheels = sorted(outdir.glob(f"{pkg.artifact_stem}-*.whl"))
    sdists = sorted(outdir.glob(f"{pkg.artifact_stem}.tar.gz"))
    return (wheels[-1] if wheels else None), (sdists[-1] if sdists else None)


def read_wheel(wheel: Path) -> tuple[set[str], email.message.Message, str]:
    """(file names, METADATA, entry_points.txt) of a wheel."""
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(zf.read(info).decode())
        eps_name = info.replace("METADATA", "entry_points.txt")
        eps = zf.read(eps_name).decode() if eps_name in names else ""
    return names, meta, eps


def check_metadata(pkg: Package, meta: email.message.Message, eps: str, core_pkg: Package) -> list[str]:
    from packaging.requirements import Requirement
    from packaging.version import Version

    problems: list[str] = []
    where = f"{pkg.name}: wheel metadata"
    if normalize(meta.get("Name", "")) != normalize(pkg.name):
        problems.append(f"{where}: Name is {meta.get('Name')!r}, pyproject.toml says {pkg.name!r}")
    if meta.get("Version") != pkg.version:
        problems.append(f"{where}: Version is {meta.get('Version')!r}, expected {pkg.version!r}")
    for key in ("Summary", "Requires-Python", "License-Expression", "License-File"):
        if not meta.get(key):
            problems.append(f"{where}: no {key}")
    if meta.get("Description-Content-Type", "").split(";")[0] != "text/markdown" or len(meta.get_payload() or "") < 200:
        problems.append(f"{where}: the long description is not the package's markdown README")
    classifiers = meta.get_all("Classifier") or []
    if not any(c.startswith("Programming Language :: Python :: 3") for c in classifiers) or \
            not any(c.startswith("Development Status ::") for c in classifiers):
        problems.append(f"{where}: classifiers must give the Python versions and the development status")
    if pkg.is_core:
        return problems
    reqs = [Requirement(r) for r in meta.get_all("Requires-Dist") or []]
    if any(normalize(r.name) == "rlinf" for r in reqs):
        problems.append(f"{where}: depends on 'rlinf', which on the index is another project; depend on {core_pkg.name!r}")
    if pkg.is_library:  # a helper library plugins share: no entry point, needs no core
        return problems
    on_core = [r for r in reqs if normalize(r.name) == normalize(core_pkg.name) and not r.marker]
    if not on_core:
        problems.append(f"{where}: no dependency on the core {core_pkg.name!r}")
    for r in on_core:
        if Version(core_pkg.version) not in r.specifier:
            problems.append(f"{where}: requires {r}, which excludes the core's version {core_pkg.version}")
        if not any(s.operator in ("<", "<=", "~=", "==") for s in r.specifier):
            problems.append(f"{where}: requires {r} with no upper bound; a future core may break it")
    if not re.search(r"^\[rlinf\]\s*\n\s*\S+\s*=", eps, re.M):
        problems.append(f"{pkg.name}: wheel declares no entry point in the 'rlinf' group")
    return problems


def check_contents(pkg: Package, wheel_names: set[str], sdist_names: set[str]) -> list[str]:
    """Every shipped source file is in the wheel and in the sdist; the sdist can rebuild the package."""
    problems: list[str] = []
    expected = source_files(pkg)
    missing = sorted(k for k in expected if k not in wheel_names)
    if missing:
        where = "pyproject.toml" if pkg.is_core else f"{pkg.path.parent.name}/{pkg.path.name}/pyproject.toml"
        problems.append(f"{pkg.name}: {len(missing)} file(s) missing from the wheel, e.g. {', '.join(missing[:3])} "
                        f"(add their package or data pattern to {where})")
    if not any(n.endswith(".dist-info/licenses/LICENSE") for n in wheel_names):
        problems.append(f"{pkg.name}: no LICENSE in the wheel")
    prefix = next((n.split("/")[0] for n in sdist_names), "")
    in_sdist = {n[len(prefix) + 1:] for n in sdist_names}
    for need in ("PKG-INFO", "pyproject.toml", "README.md", "LICENSE"):
        if need not in in_sdist:
            problems.append(f"{pkg.name}: sdist has no {need}")
    src_missing = sorted(str(p.relative_to(pkg.path)) for p in expected.values()
                         if str(p.relative_to(pkg.path)) not in in_sdist)
    if src_missing:
        problems.append(f"{pkg.name}: {len(src_missing)} source file(s) missing from the sdist, e.g. {', '.join(src_missing[:3])}")
    return problems


def check_readme(pkg: Package) -> list[str]:
    """The README is the package's page on the index: what it adds, install by name, an example,
    what was verified; a plugin's has no relative links (they break there)."""
    readme = pkg.path / str(pkg.pyproject["project"].get("readme", ""))
    if not readme.is_file() or readme.name != "README.md":
        return [f"{pkg.name}: pyproject.toml names no README.md (readme = \"README.md\")"]
    text = readme.read_text()
    problems = []
    headings = [h.strip().lower() for h in re.findall(r"^#{2,3} (.+)$", text, re.M)]
    for section in README_SECTIONS:
        if not any(h.startswith(section) or h.startswith(f"what is {section}") or h.startswith(f"what was {section}")
                   for h in headings):
            problems.append(f"{pkg.name}: README.md has no '## {section.capitalize()}' section")
    if not re.search(rf"pip install[^\n]*\b{re.escape(pkg.name)}\b", text):
        problems.append(f"{pkg.name}: README.md has no `pip install {pkg.name}` line")
    if not pkg.is_core:
        relative = [m for m in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:|#", m)]
        if relative:
            problems.append(f"{pkg.name}: README.md has relative links {relative[:3]}; they break on the index page")
    if not (pkg.path / "LICENSE").is_file():
        problems.append(f"{pkg.name}: no LICENSE file beside pyproject.toml")
    return problems


def check(outdir: Path, pkgs: list[Package] | None = None, twine: bool = True) -> list[str]:
    """Every problem found with the built artifacts in outdir (an empty list: ready to upload)."""
    pkgs = pkgs or packages()
    core_pkg = core(pkgs)
    problems: list[str] = []
    files: list[Path] = []
    for pkg in pkgs:
        problems += check_readme(pkg)
        wheel, sdist = artifacts_of(pkg, outdir)
        if wheel is None or sdist is None:
            problems.append(f"{pkg.name}: no {'wheel' if wheel is None else 'sdist'} {pkg.artifact_stem} in {outdir}")
            continue
        files += [wheel, sdist]
        names, meta, eps = read_wheel(wheel)
        with tarfile.open(sdist) as tf:
            sdist_names = {m.name for m in tf.getmembers() if m.isfile()}
        problems += check_metadata(pkg, meta, eps, core_pkg)
        problems += check_contents(pkg, names, sdist_names)
    if twine and files:
        res = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", *map(str, files)],
                             capture_output=True, text=True, timeout=600)
        if res.returncode != 0:
            problems.append("twine check --strict failed:\n" + (res.stdout + res.stderr)[-4000:])
    return problems


# -- names on the index ------------------------------------------------------------------------
def index_status(name: str, timeout: float = 30) -> tuple[str, str]:
    """('free' | 'taken' | 'unknown', evidence) for ``name`` on pip's default index.

    Two probes: the simple page of the normalised name (404: no project of that name) and
    ``pip index versions`` (no release). The index also refuses names too similar to existing ones
    (separators removed, confusable letters); only an upload can reveal that rule's answer.
    """
    import urllib.error
    import urllib.request

    from pip._internal.models.index import PyPI

    def page_status(project: str) -> int:
        url = f"{PyPI.simple_url}/{project}/"
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers={"Accept": "text/html"}), timeout=timeout) as r:
                return r.status
        except urllib.error.HTTPError as exc:
            return exc.code

    try:
        # the name, and the name without separators (the index refuses names equal after removing them)
        codes = {normalize(name): page_status(normalize(name)), normalize(name).replace("-", ""): 0}
        codes[normalize(name).replace("-", "")] = page_status(normalize(name).replace("-", ""))
    except (urllib.error.URLError, OSError) as exc:
        return "unknown", f"index unreachable ({exc})"
    page = "; ".join(f"simple page of {k}: {v}" for k, v in codes.items())
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    res = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "--isolated", "--index-url",
                          PyPI.simple_url, name], capture_output=True, text=True, timeout=120, env=env)
    lines = [ln for ln in (res.stdout + res.stderr).splitlines() if ln.strip() and "experimental" not in ln]
    versions = lines[0].strip() if lines else f"exit {res.returncode}"
    if all(code == 404 for code in codes.values()) and res.returncode != 0:
        return "free", f"{page}; pip index versions: {versions}"
    return "taken", f"{page}; pip index versions: {versions}"


def config_history() -> int:
    """Store the installed defaults as rlinf_cli/conf_history/<version>.yaml (say if it changed)."""
    from rlinf_cli.confhistory import HISTORY, write_snapshot

    before = {p: p.read_text() for p in HISTORY.glob("*.yaml")}
    path = write_snapshot()
    changed = before.get(path) != path.read_text()
    rel = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    print(f"{rel}: {'written (commit it with the release)' if changed else 'unchanged'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list")
    for name in ("dist", "check"):
        p = sub.add_parser(name)
        p.add_argument("--outdir", type=Path, default=REPO / "dist")
        if name == "dist":
            p.add_argument("--no-isolation", action="store_true", help="build with this environment's setuptools")
    p = sub.add_parser("names")
    p.add_argument("extra", nargs="*", help="more names to check (planned packages)")
    sub.add_parser("config-history", help="store this version's defaults in rlinf_cli/conf_history/")
    args = ap.parse_args(argv)
    pkgs = packages()
    if args.cmd == "list":
        for p in pkgs:
            print(f"{p.name:28} {p.version:10} {p.path.relative_to(REPO) if p.path != REPO else '.'}")
        return 0
    if args.cmd == "config-history":
        return config_history()
    if args.cmd == "names":
        print(f"# {time.strftime('%Y-%m-%d')}: python tools/release.py names")
        worst = 0
        for name in [p.name for p in pkgs] + list(args.extra):
            status, evidence = index_status(name)
            print(f"{name:28} {status:8} {evidence}")
            worst = max(worst, {"free": 0, "unknown": 1, "taken": 2}[status])
        return worst
    if args.cmd == "dist":
        build(args.outdir, pkgs, isolation=not args.no_isolation)
    problems = check(args.outdir, pkgs)
    for line in problems:
        print(f"problem: {line}", file=sys.stderr)
    if problems:
        return 1
    print(f"{len(pkgs)} packages: wheels and sdists in {args.outdir} pass the checks (twine check --strict included)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
