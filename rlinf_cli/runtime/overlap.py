"""Rollouts that overlap the update: the next rollout is collected in a separate process while the
driver trains on the current one (``runtime.overlap_update=true``).

The trade-off, stated plainly: rollout k+1 is collected with the weights from *before* update k
(one policy version behind), so PPO's first epoch starts from a ratio that is no longer exactly
1; its clipping absorbs the lag (the same staleness every asynchronous actor-learner accepts).
In exchange, a rollout costs no wall time as long as it is shorter than the update, which on a
2-core machine nearly halves a PPO iteration. Resuming such a run continues it, but not
bit-identically (the in-flight rollout is not checkpointed).

The rollout process rebuilds the policy from its class (``policy.config`` and its env spec) and
receives weights through shared-memory tensors, so no weights are pickled.
"""

from __future__ import annotations

import pickle
import traceback
from typing import Any, Callable, Mapping, Sequence

import torch

from rlinf_cli.experience import Experience
from rlinf_cli.runtime.shm import SharedTensors


def _rollout_main(conn: Any, sim_bytes: bytes, policy_cls: type, model_cfg: dict, spec: dict,
                  weights: Mapping[str, torch.Tensor], num_envs: int, seed: int, executor: tuple[type, dict] | None) -> None:
    torch.set_num_threads(1)
    try:
        from rlinf_cli.api import EnvSpec
        from rlinf_cli.runtime.placement import runtime_config
        from rlinf_cli.runtime.rollout import Runner
        from rlinf_cli.runtime.vector import SyncVecEnv
        from rlinf_cli.runtime.hosting import hosted_vec_env

        torch.manual_seed(seed)
        simulator = pickle.loads(sim_bytes)
        policy = policy_cls(model_cfg, EnvSpec.from_dict(spec))  # the driver's class: no second plugin lookup
        policy.eval()
        if executor is not None:
            executor_cls, executor_cfg = executor  # the driver's executor class and settings
            env = executor_cls(executor_cfg).make_vec_env(simulator, num_envs, True)
        elif (hosted := hosted_vec_env(simulator, runtime_config(None), num_envs, True, "overlapped rollouts")) is not None:
            env = hosted  # sim=remote: sessions on its servers, not one remote env per instance
        else:
            env = SyncVecEnv(simulator, range(num_envs), autoreset=True)
        runner = Runner(env, policy)
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    conn.send(("ok", None))
    try:
        while True:
            msg = conn.recv()
            if msg[0] == "close":
                break
            _, num_steps, seeds = msg
            try:
                policy.load_state_dict(weights)
                if seeds is not None:
                    runner.reset(seeds)
                conn.send(("ok", runner.collect_steps(num_steps)))
            except BaseException:
                conn.send(("error", traceback.format_exc()))
    except (EOFError, KeyboardInterrupt):
        pass
    finally:
        env.close()


class OverlappedRunner:
    """Runner-like: ``collect_steps`` returns a rollout and starts collecting the next one.

    ``seeds_at(i)`` gives the env seeds to reset with before rollout ``i`` (None: continue).
    """

    def __init__(self, simulator: Any, policy: Any, num_envs: int, seed: int,
                 seeds_at: Callable[[int], Sequence[int] | None], start_iteration: int = 0,
                 executor: tuple[type, dict] | None = None, start_method: str = "forkserver"):
        import torch.multiprocessing as tmp

        self.policy = policy
        self.seeds_at = seeds_at
        self.iteration = start_iteration
        # shared-memory copies of the weights: the driver writes them only while no rollout runs
        self.weights = SharedTensors(policy.state_dict())  # packed: one descriptor per dtype (runtime/shm.py)
        ctx = tmp.get_context(start_method)
        self.conn, child = ctx.Pipe(duplex=True)
        # not a daemon: its executor may start env workers of its own
        self.proc = ctx.Process(target=_rollout_main, daemon=False, name="rlinf-rollout", args=(
            child, pickle.dumps(simulator), type(policy), dict(policy.config), policy.env_spec.to_dict(), self.weights,
            num_envs, seed, executor))
        self.proc.start()
        child.close()
        self._pending = False
        self._reply()

    def _reply(self) -> Any:
        from rlinf_cli.runtime.workers import EnvWorkerError, last_line

        try:
            status, payload = self.conn.recv()
        except EOFError:
            self.proc.join(timeout=1)
            raise EnvWorkerError(f"the rollout process died (exit code {self.proc.exitcode})") from None
        if status == "error":
            raise EnvWorkerError(f"the rollout process failed: {last_line(payload, 'unknown error')}")
        return payload

    def _request(self, num_steps: int) -> None:
        self.weights.write(self.policy.state_dict())
        seeds = self.seeds_at(self.iteration)
        self.conn.send(("collect", num_steps, None if seeds is None else list(seeds)))
        self._pending = True

    def collect_steps(self, num_steps: int) -> Experience:
        if not self._pending:
            self._request(num_steps)
        rollout = self._reply()
        self._pending = False
        self.iteration += 1
        self._request(num_steps)  # with the weights of now: before the caller's update
        return rollout

    def close(self) -> None:
        """Stop the rollout process; a prefetched rollout nobody will use is not waited for."""
        try:
            if not self._pending:
                self.conn.send(("close",))
                self.proc.join(timeout=10)
        except (OSError, EOFError):
            pass
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.proc.kill()
