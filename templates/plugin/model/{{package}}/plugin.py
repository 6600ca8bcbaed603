"""Registers the model. Keep this module light: torch is imported by the factory module only."""

from rlinf_cli.api import hookimpl

RLINF_API = "1.5"  # the plugin API this plugin is built for (rlinf_cli.api.API_VERSION)


@hookimpl
def register_models(register):
    register("{{name}}", "{{package}}.model:Model", summary="{{name}}: linear policy and value")
