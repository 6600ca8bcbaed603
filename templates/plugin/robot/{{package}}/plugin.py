"""Registers the robot as a simulator. Keep this module light: no driver or torch imports here."""

from rlinf_cli.api import hookimpl

RLINF_API = "1.5"  # the plugin API this plugin is built for (rlinf_cli.api.API_VERSION)


@hookimpl
def register_simulators(register):
    register("{{name}}", "{{package}}.sim:Simulator", summary="{{name}}: a robot (fake cart-pole until you plug in yours)")
