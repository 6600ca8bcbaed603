"""The simulator contract: the checks of `rlinf check-sim` (``rlinf_cli.checks``, the one
implementation) on a simulator built from its own config option."""

from __future__ import annotations

from typing import Any

from rlinf_cli.testing.plugins import installed, option, spec_of
from rlinf_cli.testing.report import Check, Checks, as_checks


def simulator_checks(name: str, overrides: dict[str, Any] | None = None) -> list[Check]:
    """``check-sim``'s rows for the installed simulator ``name`` (its ``conf/sim/NAME.yaml`` plus
    ``overrides``). A hosted simulator (``sim=remote``) is pointed at an env server started here
    for another installed simulator."""
    from rlinf_cli.checks import check_simulator, check_text_task

    checks = Checks()
    spec = spec_of("simulator", name)
    node: dict[str, Any] = {}
    if not checks.run(f"conf/sim/{name}.yaml", lambda: node.update(option(spec, "sim")) or ""):
        return checks.rows
    node.update(overrides or {})
    if spec.attrs.get("modality") == "text":
        return as_checks(check_text_task(spec.load()(node)))
    if not spec.attrs.get("hosted"):
        return as_checks(check_simulator(spec.load()(node)))
    from rlinf_cli.remote.server import EnvServer, ServeConfig

    served = _servable()
    server = EnvServer(served.load()(option(served, "sim")), ServeConfig(port=0), served.name)
    node["address"] = f"127.0.0.1:{server.start()}"
    try:
        return as_checks(check_simulator(spec.load()(node)))
    finally:
        server.stop(grace=0)


def _servable() -> Any:
    """The simulator a hosted one is checked against: gymnasium where installed (fast, no extras)."""
    local = [s for s in installed("simulator", embodied=True)
             if not s.attrs.get("hosted") and not s.attrs.get("test_marker")]
    assert local, "a hosted simulator is checked against a served one, and no other simulator is installed"
    return next((s for s in local if s.name == "gymnasium"), local[0])
