"""Env workers as Ray actors: the same ``rlinf_cli.api.EnvWorker`` the local executor runs in
processes, hosted by actors that Ray places on the cluster's nodes. The core places the envs
(``rlinf_cli.api.WorkerExecutor``); this executor starts the actors.

Observations travel through Ray's object store, compressed by ``env.obs_compression`` when set
(worth it between machines). ``runtime.mode=hybrid`` pipelines env groups as locally; any
other mode means synchronous actors (``executor=ray`` always places envs in actors).
Every node needs rlinf and the simulator's plugin installed, as for any Ray job.

Generation workers (``placement.generation.workers``) are actors too, each reserving
``placement.generation.cpus/gpus/resources``; they get the policy's files once through the object
store, and each new weight version as one ``ray.put`` that every worker lacking it gets.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from rlinf_cli.api import (EnvWorker, GenerationPlan, GenerationWorker, RankJob, RemoteError, UserError, WorkerDied,
                           WorkerExecutor, WorkerHandle, WorkerPlan, cpu_cores, settings)


@dataclass(frozen=True)
class RayConfig:
    address: str | None = None  # cluster address; None = RAY_ADDRESS if set, else start a local Ray instance
    num_cpus_per_worker: float = 1.0  # CPUs each env-worker actor reserves
    num_gpus_per_worker: float = 0.0  # GPUs each env-worker actor reserves
    worker_resources: dict[str, float] = field(default_factory=dict)  # custom Ray resources each env-worker actor reserves
    namespace: str = "rlinf"  # Ray namespace
    log_to_driver: bool | str = "auto"  # forward actor output to the driver's terminal; auto = only trainer ranks'

    def __post_init__(self) -> None:
        if self.log_to_driver not in (True, False, "auto"):
            raise ValueError(f"executor.log_to_driver must be true, false or auto, got {self.log_to_driver!r}")


class RayEnvWorker(EnvWorker):
    """The env worker an actor hosts; pins thread pools first (actors reuse pooled processes,
    so this is cheaper than a per-actor ``runtime_env``, which forces a fresh process)."""

    def __init__(self, *args: Any, env_vars: dict[str, str] | None = None) -> None:
        os.environ.update(env_vars or {})
        if "torch" in __import__("sys").modules:
            __import__("torch").set_num_threads(1)
        super().__init__(*args)


class RayGenerationWorker(GenerationWorker):
    """The generation worker an actor hosts (its torch threads are the trainer's: the plan says how many)."""

    def __init__(self, *args: Any, env_vars: dict[str, str] | None = None) -> None:
        os.environ.update(env_vars or {})
        super().__init__(*args)


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise UserError("executor=ray needs Ray: pip install rlinf-executor-ray (or pip install ray)") from exc
    return ray


class RayWorker:
    """A ``rlinf_cli.api.WorkerHandle`` for one env-worker actor."""

    def __init__(self, index: int, actor_cls: Any, args: tuple, kwargs: dict, timeout_s: float | None):
        self.index = index
        self._cls = actor_cls
        self._args = args
        self._kwargs = kwargs
        self.timeout_s = timeout_s
        self.generation = 0
        self.actor: Any = None
        self._ready: Any = None
        self.start()

    def start(self) -> None:
        self.actor = self._cls.remote(*self._args, **self._kwargs)
        self.generation += 1
        self._ready = self.actor.ping.remote()

    def wait_ready(self) -> Any:
        return self.result((self.generation, self._ready))

    def submit(self, method: str, *args: Any) -> tuple[int, Any]:
        return self.generation, getattr(self.actor, method).remote(*args)

    def result(self, ticket: tuple[int, Any]) -> Any:
        ray = _ray()
        gen, ref = ticket
        if gen != self.generation:
            raise WorkerDied("the actor was restarted since this request")
        try:
            return ray.get(ref, timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError:
            ray.kill(self.actor)
            raise WorkerDied(f"no reply in {self.timeout_s:.0f} s (runtime.worker_timeout_s); killed it") from None
        except ray.exceptions.RayActorError as exc:
            text = str(exc).strip()
            if "creation task" in text:  # the simulator raised while the actor built its envs
                raise RemoteError(text) from None
            raise WorkerDied(f"actor died: {text.splitlines()[0]}") from None
        except ray.exceptions.RayTaskError as exc:
            raise RemoteError(_task_error_text(exc)) from None

    def restart(self) -> None:
        self.kill()
        self.start()
        self.wait_ready()

    def kill(self) -> None:
        try:
            _ray().kill(self.actor)
        except Exception:  # already gone
            pass

    def close(self) -> None:
        ray = _ray()
        try:
            ray.get(self.actor.close.remote(), timeout=10)
        except Exception:  # a dead actor has nothing to close
            pass
        try:
            ray.kill(self.actor)
        except Exception:
            pass

    def describe(self) -> str:
        return f"actor {self.actor}"


def _task_error_text(exc: Any) -> str:
    """The simulator's own exception line, not Ray's wrapper around it."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {cause}"
    return str(exc)


class RayExecutor(WorkerExecutor):
    name = "ray"
    in_process = False  # envs always live in actors
    worker_noun = "a Ray env worker"
    hosted_note = "ray (envs on env servers; no actors needed)"
    collocated_note = ("; executor=ray runs envs in actors anyway (synchronously): use executor=local to keep them "
                       "in this process")

    def __init__(self, cfg: Mapping[str, Any]):
        super().__init__(cfg)
        self.cfg = settings.build(RayConfig, self.cfg, "executor")
        self._placement = "ray (not started)"

    def _init(self, cpus: float, ranks: bool = False) -> Any:
        """Join the cluster (or start a local instance with room for ``cpus`` CPUs of actors)."""
        ray = _ray()
        if not ray.is_initialized():
            import logging

            # trainer ranks: rank 0's notes and tables are the run's output, so they come here
            log = ranks if self.cfg.log_to_driver == "auto" else bool(self.cfg.log_to_driver)
            kwargs: dict[str, Any] = {"namespace": self.cfg.namespace, "log_to_driver": log,
                                      "include_dashboard": False, "ignore_reinit_error": True,
                                      "logging_level": logging.WARNING}
            # RAY_ADDRESS (set for a Ray job's entrypoint, e.g. a KubeRay RayJob) means that cluster:
            # ray.init would join it anyway, and refuses num_cpus when it does
            address = self.cfg.address or os.environ.get("RAY_ADDRESS") or None
            if address:
                kwargs["address"] = address
            else:  # a local instance with room for every actor, even on a small machine
                kwargs["num_cpus"] = max(cpu_cores(), int(cpus + 0.999))
                # Ray gives its GCS server 30 s to come up; a busy 2-core machine can need more
                # (seen in the test suite under load). A user's own value wins.
                os.environ.setdefault("RAY_gcs_server_port_wait_time_s", "120")
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a local, single-user instance
            for attempt in range(3):
                try:
                    ray.init(**kwargs)
                    break
                except Exception as exc:  # Ray raises a bare Exception when its raylet is slow to start
                    # A local raylet gets a fixed 30 s to register (not configurable in Ray 2.60), and
                    # under load a GCS server was seen never to write its port file; a fresh start of
                    # the local instance has come up every time so far.
                    slow = "timed out" in str(exc).lower() and not address
                    if slow and attempt < 2:
                        ray.shutdown()
                        continue
                    if not isinstance(exc, (ConnectionError, RuntimeError, ValueError)) and not slow:
                        raise
                    where = address or "a local instance"
                    raise UserError(f"cannot start Ray ({where}): {str(exc).splitlines()[0]}") from exc
            from rlinf_executor_ray import headwatch

            headwatch.watch(ray)  # this process joined (or started) the cluster: its head's loss is one line
        return ray

    def start_workers(self, plan: WorkerPlan) -> list[WorkerHandle]:
        # a local instance started here is sized twice over: an rl run's evaluations (eval.best's
        # validation, eval.interval) start their own env actors while the training ones stand idle
        ray = self._init(2 * plan.num_workers * self.cfg.num_cpus_per_worker)
        env_vars = {"LP_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
        if "MUJOCO_GL" in os.environ:
            env_vars["MUJOCO_GL"] = os.environ["MUJOCO_GL"]
        actor_cls = ray.remote(RayEnvWorker).options(num_cpus=self.cfg.num_cpus_per_worker,
                                                     num_gpus=self.cfg.num_gpus_per_worker,
                                                     resources=dict(self.cfg.worker_resources))
        handles = []
        try:
            for w in range(plan.num_workers):
                handles.append(RayWorker(w, actor_cls, plan.worker_args(w), {"env_vars": env_vars}, plan.timeout_s))
            for h in handles:
                h.wait_ready()
        except (RemoteError, WorkerDied):
            for h in handles:
                h.close()
            raise
        return handles

    def label(self, plan: WorkerPlan) -> str:
        rt, hybrid = plan.runtime, plan.runtime.mode == "hybrid"
        where = self.cfg.address or os.environ.get("RAY_ADDRESS") or "local Ray instance"
        return (f"ray ({where}), {'hybrid' if hybrid else 'disaggregated'}: {plan.num_envs} envs in "
                f"{plan.num_workers} actor(s)" + (f", {plan.stages} pipeline stages" if hybrid else "")
                + f", obs_compression={rt.obs_compression}" + ("+xor-delta" if rt.obs_delta else ""))

    def start_generation_workers(self, plan: GenerationPlan) -> list[WorkerHandle]:
        """``plan.num_workers`` generation-worker actors, each reserving ``placement.generation``'s
        resources; the policy's files go to the object store once, for all of them."""
        g = plan.placement
        ray = self._init(plan.num_workers * g.cpus)
        actor_cls = ray.remote(RayGenerationWorker).options(num_cpus=g.cpus, num_gpus=g.gpus, resources=dict(g.resources))
        image, *rest = plan.worker_args()
        args = (ray.put(image), *rest)  # resolved by Ray for each actor: one copy in the object store
        env_vars = {"OMP_NUM_THREADS": str(plan.threads)}
        handles = []
        try:
            for w in range(plan.num_workers):
                handles.append(RayWorker(w, actor_cls, args, {"env_vars": env_vars}, plan.timeout_s))
            for h in handles:
                h.wait_ready()
        except (RemoteError, WorkerDied):
            for h in handles:
                h.kill()
            raise
        return handles

    def publish_weights(self, tensors: dict[str, Any]) -> Any:
        """One weight version in the object store; a worker lacking it gets it as its request's argument."""
        return _ray().put(tensors)

    def driver_address(self) -> str:
        """This node's address as the cluster sees it: a broadcast group's store listens here."""
        return str(_ray().util.get_node_ip_address())

    def start_ranks(self, job: RankJob) -> Any:
        """``placement.trainer.ranks`` trainer ranks as actors in one placement group (rlinf_executor_ray/ranks.py);
        returns rank 0's result, raises ``RankDied`` when a rank's actor or node is lost."""
        from rlinf_executor_ray.ranks import start_ranks

        # a local instance needs room for each rank's env actors (runtime.env_workers, 0 = one per core),
        # twice: evaluations during training (eval.interval) start their own beside the training ones;
        # and for each rank's generation workers
        envs = 2 * (self.runtime.env_workers or cpu_cores()) * self.cfg.num_cpus_per_worker
        gen = job.generation.workers * job.generation.cpus if job.generation is not None else 0.0
        ray = self._init(job.ranks * (job.trainer.cpus + envs + gen), ranks=True)
        return start_ranks(ray, job, self.cfg.namespace)

    @staticmethod
    def cluster_report() -> list[str] | None:
        """For `rlinf doctor`: the Ray cluster this machine sees (RAY_ADDRESS, or one started here with
        `ray start`), a line per node; None when Ray is not installed."""
        from rlinf_executor_ray.cluster import report

        return report()
