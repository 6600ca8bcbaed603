"""LIBERO as an rlinf simulator. Importing this module imports neither libero, robosuite nor mujoco."""

from rlinf_cli.api import hookimpl

RLINF_API = "1.5"  # the plugin API this plugin is built for (rlinf_cli.api.API_VERSION)


@hookimpl
def register_simulators(register):
    register("libero", "rlinf_sim_libero.sim:LiberoSimulator",
             summary="LIBERO suites (spatial/object/goal/10/90): instructions, two cameras, fixed initial states, success",
             # LIBERO itself is an opt-in install (`make libero`): the repository's contract test of
             # this simulator runs under the pytest marker `libero` (`make test-libero`), not in `make test`
             test_marker="libero")
