from rlinf_cli.api import hookimpl

RLINF_API = "1.5"  # the plugin API this plugin is built for (rlinf_cli.api.API_VERSION)


@hookimpl
def register_executors(register):
    register("local", "rlinf_executor_local.executor:LocalExecutor", summary="Env instances on this machine", default=True)
