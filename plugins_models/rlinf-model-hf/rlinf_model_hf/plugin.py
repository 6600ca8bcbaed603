"""Entry point: registers the model by name. The factory (torch, transformers) loads on use."""

from rlinf_cli.api import hookimpl

RLINF_API = "1.5"  # the plugin API this plugin is built for (rlinf_cli.api.API_VERSION)


@hookimpl
def register_models(register):
    register("hf", "rlinf_model_hf.model:HFCausalLM", modality="text",
             summary="transformers causal LM: local dir, GGUF, or a tiny preset with a char tokenizer; KV-cache sampling")
