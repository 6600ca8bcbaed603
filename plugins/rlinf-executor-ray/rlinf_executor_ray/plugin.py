from rlinf_cli.api import hookimpl

RLINF_API = "1.5"  # the plugin API this plugin is built for (rlinf_cli.api.API_VERSION)


@hookimpl
def register_executors(register):
    # the factory is a lazy string: listing plugins never imports Ray
    register("ray", "rlinf_executor_ray.executor:RayExecutor", summary="Env workers as Ray actors (local Ray or a cluster)")
