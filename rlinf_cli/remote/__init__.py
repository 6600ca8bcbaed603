"""Simulators in other processes, Python environments or machines: ``rlinf env serve`` and its client.

- :mod:`~rlinf_cli.remote.wire`: how messages are encoded (msgpack; arrays as raw bytes with
  dtype and shape; never pickle), and the checks every received message passes.
- :mod:`~rlinf_cli.remote.messages`: what the server accepts: its settings (``ServeConfig``) and
  every client message checked (shards, seeds, actions) before it reaches a worker.
- :mod:`~rlinf_cli.remote.server`: the gRPC server's life cycle and transport. Each client session is one bidirectional
  stream; its envs live in one :class:`~rlinf_cli.runtime.workers.EnvWorker` hosted in a worker
  process (the same process machinery as the local executor's).
- :mod:`~rlinf_cli.remote.client`: the client side: a
  :class:`~rlinf_cli.runtime.workers.WorkerHandle` over a session (so every executor and
  runtime mode steps remote envs with the same code, crash recovery included), a single remote
  env for ``check-sim``, and the remote expert.

Nothing here imports torch: the server runs in a simulator's own environment (numpy<2, another
Python, a robot's computer), which may not have it.
"""
