"""Entry point: registers the model by name. The factory (torch, transformers) loads on use."""

from rlinf_cli.api import hookimpl


@hookimpl
def register_models(register):
    register("vla", "rlinf_model_vla.model:VLAPolicy",
             summary="vision-language-action policy: image encoder + causal LM backbone + action-token head")
