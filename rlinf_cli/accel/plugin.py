"""The built-in CPU backend, registered through rlinf's own entry point like any plugin."""

from rlinf_cli.api import API_VERSION
from rlinf_cli.hookspecs import hookimpl

RLINF_API = API_VERSION  # the core's own plugin speaks the core's API


@hookimpl
def register_accelerators(register):
    register("cpu", "rlinf_cli.accel:CPU", summary="CPU (built in; gloo for several processes)", priority=0)
