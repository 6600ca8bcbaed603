from rlinf_cli.api import hookimpl

RLINF_API = "1.5"  # the plugin API this plugin is built for (rlinf_cli.api.API_VERSION)


@hookimpl
def register_accelerators(register):
    # `accelerator=auto` takes the available backend with the highest priority
    register("musa", "rlinf_accel_musa.backend:MUSA", summary="Moore Threads GPUs via torch_musa (mccl)", priority=20)
