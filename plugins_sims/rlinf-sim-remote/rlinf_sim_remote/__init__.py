"""``sim=remote``: train against envs served by ``rlinf env serve``. Importing this imports no gRPC."""
