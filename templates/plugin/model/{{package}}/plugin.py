"""Registers the model. Keep this module light: torch is imported by the factory module only."""

from rlinf_cli.api import hookimpl


@hookimpl
def register_models(register):
    register("{{name}}", "{{package}}.model:Model", summary="{{name}}: linear policy and value")
