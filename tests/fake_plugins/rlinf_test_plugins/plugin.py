from rlinf_cli.hookspecs import hookimpl

RLINF_API = "1.5"  # the plugin API this plugin is built for (rlinf_cli.api.API_VERSION)


@hookimpl
def register_simulators(register):
    register("counter_norep", "rlinf_test_plugins.parts:NoReplaySim", summary="counter envs that cannot be replayed")


@hookimpl
def register_algorithms(register):
    register("a2c_bad", "rlinf_test_plugins.parts:BadA2C", summary="an algorithm whose config lacks rollout_steps")
    register("a2c", "rlinf_test_plugins.a2c:A2C", summary="A2C against the documented contract only")
