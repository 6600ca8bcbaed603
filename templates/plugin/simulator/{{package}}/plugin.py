"""Registers the simulator. Keep this module light: no simulator or torch imports here."""

from rlinf_cli.api import hookimpl

RLINF_API = "1.5"  # the plugin API this plugin is built for (rlinf_cli.api.API_VERSION)


@hookimpl
def register_simulators(register):
    register("{{name}}", "{{package}}.sim:Simulator", summary="{{name}}: move a point to a target on a line")
