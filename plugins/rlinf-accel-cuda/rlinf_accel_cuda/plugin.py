from rlinf_cli.api import hookimpl

RLINF_API = "1.5"  # the plugin API this plugin is built for (rlinf_cli.api.API_VERSION)


@hookimpl
def register_accelerators(register):
    # `accelerator=auto` takes the available backend with the highest priority
    register("cuda", "rlinf_accel_cuda.backend:CUDA", summary="NVIDIA GPUs via a CUDA build of torch (nccl)", priority=30)
