from rlinf_cli.api import hookimpl


@hookimpl
def register_models(register):
    register("mlp", "rlinf_model_mlp.model:MLPPolicy", summary="MLP actor-critic: categorical or Gaussian actions", default=True)
