from rlinf_cli.api import hookimpl

RLINF_API = "1.5"  # the plugin API this plugin is built for (rlinf_cli.api.API_VERSION)


@hookimpl
def register_accelerators(register):
    # `accelerator=auto` takes the available backend with the highest priority
    register("rocm", "rlinf_accel_rocm.backend:ROCm", summary="AMD GPUs via a ROCm build of torch (rccl, as nccl)", priority=30)
