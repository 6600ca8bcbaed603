"""Install test-only plugins without pip: a site directory holding dist-info entries (what pip
would write) and the plugin modules, put on PYTHONPATH of an `rlinf` subprocess."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

FAKE = Path(__file__).resolve().parent / "fake_plugins"


def _dist(site: Path, name: str, entry_points: dict[str, str]) -> None:
    info = site / f"{name.replace('-', '_')}-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[rlinf]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items()))


def plugin_env(site: Path) -> dict[str, str]:
    """Environment for a subprocess that sees the test plugins: ``rlinf-test-plugins`` (a
    simulator that cannot replay, an algorithm missing a config key) and ``rlinf-sim-brokenthing``,
    installed but failing to import."""
    if not site.exists():
        site.mkdir(parents=True)
        shutil.copytree(FAKE / "rlinf_test_plugins", site / "rlinf_test_plugins")
        _dist(site, "rlinf-test-plugins", {"testplugins": "rlinf_test_plugins.plugin"})
        (site / "rlinf_sim_brokenthing.py").write_text("import a_dependency_that_is_not_installed  # noqa\n")
        _dist(site, "rlinf-sim-brokenthing", {"brokenthing": "rlinf_sim_brokenthing"})
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH", "")]))
    return {**os.environ, "PYTHONPATH": path, "COLUMNS": "200"}
