"""Registers the algorithm. Keep this module light: torch is imported by the factory module only."""

from rlinf_cli.api import hookimpl

RLINF_API = "1.5"  # the plugin API this plugin is built for (rlinf_cli.api.API_VERSION)


@hookimpl
def register_algorithms(register):
    register("{{name}}", "{{package}}.algo:Algo", summary="{{name}}: advantage actor-critic, one step per rollout")
