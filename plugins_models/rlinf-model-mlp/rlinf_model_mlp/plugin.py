from rlinf_cli.api import hookimpl

RLINF_API = "1.5"  # the plugin API this plugin is built for (rlinf_cli.api.API_VERSION)


@hookimpl
def register_models(register):
    register("mlp", "rlinf_model_mlp.model:MLPPolicy", summary="MLP actor-critic: categorical or Gaussian actions", default=True)
