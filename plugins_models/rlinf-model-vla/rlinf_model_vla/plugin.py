"""Entry point: registers the model by name. The factory (torch, transformers) loads on use."""

from rlinf_cli.api import hookimpl

RLINF_API = "1.5"  # the plugin API this plugin is built for (rlinf_cli.api.API_VERSION)


@hookimpl
def register_models(register):
    register("vla", "rlinf_model_vla.model:VLAPolicy",
             summary="vision-language-action policy: image encoder + causal LM backbone + action-token head")
