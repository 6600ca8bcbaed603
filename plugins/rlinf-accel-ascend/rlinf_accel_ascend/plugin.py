from rlinf_cli.api import hookimpl

RLINF_API = "1.5"  # the plugin API this plugin is built for (rlinf_cli.api.API_VERSION)


@hookimpl
def register_accelerators(register):
    # `accelerator=auto` takes the available backend with the highest priority
    register("ascend", "rlinf_accel_ascend.backend:Ascend", summary="Huawei Ascend NPUs via torch_npu (hccl)", priority=20)
