from rlinf_cli.api import hookimpl


@hookimpl
def register_executors(register):
    register("local", "rlinf_executor_local.executor:LocalExecutor", summary="Env instances on this machine", default=True)
