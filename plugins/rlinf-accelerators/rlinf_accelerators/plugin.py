from rlinf_cli.hookspecs import hookimpl


@hookimpl
def register_accelerators(register):
    # `accelerator=auto` takes the available backend with the highest priority.
    register("cpu", "rlinf_accelerators.backends:CPU", summary="CPU (always available; gloo for multi-process)", priority=0)
    register("cuda", "rlinf_accelerators.backends:CUDA", summary="NVIDIA GPUs via torch.cuda (nccl)", priority=30)
    register("rocm", "rlinf_accelerators.backends:ROCm", summary="AMD GPUs via a ROCm build of torch (rccl)", priority=30)
    register("ascend", "rlinf_accelerators.backends:Ascend", summary="Huawei Ascend NPUs via torch_npu (hccl)", priority=20)
    register("musa", "rlinf_accelerators.backends:MUSA", summary="Moore Threads GPUs via torch_musa (mccl)", priority=20)
