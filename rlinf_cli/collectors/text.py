"""The text collector: a language model's completions of a task's prompts, scored by its reward.

A text policy (``rlinf-model-hf``'s ``HFCausalLM`` or any model with the same methods) provides
``encode_prompts``, ``encode_text``, ``decode``, ``generate(prompt_ids, samples=G, ...)`` (tokens,
per-token log-probs, lengths, finish reasons) and ``evaluate(obs, actions)`` on the minibatches
built here (``obs = {prompt_ids, prompt_mask}`` one row per group, ``actions = {ids, attn}`` one
row per completion). An episode is a prompt and its completion, tool turns included (tool output
is context: its tokens get loss mask 0). Experience is laid out ``[T, N]`` like any other:
"episodes" rollouts are one step of ``groups x group_size`` completions (groups side by side),
"steps" rollouts ``rollout_steps x num_envs`` one-step episodes of fresh prompts.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch

from rlinf_cli.algorithm import Algorithm, MiniBatch
from rlinf_cli.api import TEXT, TEXT_SPEC, Score, TextSample, TextTask
from rlinf_cli.collectors.base import Evaluation, training_seeds
from rlinf_cli.data.jsonl import read_rows
from rlinf_cli.errors import UserError
from rlinf_cli.experience import Experience
from rlinf_cli.registry import get_registry, make_simulator
from rlinf_cli.settings import plain

_TEXT_METHODS = ("encode_prompts", "generate", "evaluate", "decode")
META_SUFFIX = ".meta.json"


@dataclass
class Completion:
    """One sampled episode of a text task."""

    sample: TextSample
    tokens: list[int]  # completion tokens: model turns and tool output, in order
    loss_mask: list[int]  # 1 where the policy wrote the token
    logprobs: list[float]  # log pi at sampling time (0 for tool tokens)
    text: str = ""  # decoded completion (special tokens removed)
    score: Score | None = None
    turns: int = 1
    finish: str = "length"  # eos | stop | length


@dataclass
class RolloutStats:
    seconds: float = 0.0
    generated_tokens: int = 0  # tokens written by the policy
    prompts_drawn: int = 0
    groups_dropped: int = 0
    groups_kept: int = 0
    seen: list[Completion] = field(default_factory=list)


def sample_completions(policy: Any, task: TextTask, samples: Sequence[TextSample], group_size: int,
                       max_new_tokens: int, greedy: bool = False, generator: torch.Generator | None = None
                       ) -> list[Completion]:
    """``group_size`` completions per sample (rows grouped by sample), tool turns included, scored."""
    prompt_ids = policy.encode_prompts([s.prompt for s in samples])
    gen = policy.generate(prompt_ids, samples=group_size, max_new_tokens=max_new_tokens, greedy=greedy,
                          stop=tuple(task.stop), generator=generator)
    out: list[Completion] = []
    for i in range(len(samples) * group_size):
        n = int(gen.lengths[i])
        out.append(Completion(samples[i // group_size], gen.tokens[i, :n].tolist(), [1] * n,
                              gen.logprobs[i, :n].tolist(), finish=gen.finish[i]))
    for _turn in range(1, int(task.max_turns)):
        pending = []
        for c in out:
            if c.finish == "eos":
                continue
            reply = task.tool_response(c.sample, policy.decode(c.tokens))
            if reply is not None:
                tool = policy.encode_text(reply)
                c.tokens += tool
                c.loss_mask += [0] * len(tool)
                c.logprobs += [0.0] * len(tool)
                c.turns += 1
                pending.append(c)
        if not pending:
            break
        base = {id(s): ids for s, ids in zip(samples, prompt_ids)}
        more = policy.generate([base[id(c.sample)] + c.tokens for c in pending], samples=1,
                               max_new_tokens=max_new_tokens, greedy=greedy, stop=tuple(task.stop), generator=generator)
        for j, c in enumerate(pending):
            n = int(more.lengths[j])
            c.tokens += more.tokens[j, :n].tolist()
            c.loss_mask += [1] * n
            c.logprobs += more.logprobs[j, :n].tolist()
            c.finish = more.finish[j]
    for c in out:
        c.text = policy.decode(c.tokens)
        c.score = task.score(c.sample, c.text)
    return out


def accuracy(completions: Sequence[Completion]) -> float:
    return sum(bool(c.score and c.score.correct) for c in completions) / max(len(completions), 1)


def pad_rows(rows: Sequence[Sequence[float]], value: float = 0, dtype: torch.dtype = torch.long, left: bool = False,
             width: int = 0) -> torch.Tensor:
    """Rows of different lengths as one tensor, padded with ``value`` on the right (or the left) to the
    longest row (at least ``width``)."""
    width = max(width, *(len(r) for r in rows))
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, r in enumerate(rows):
        start = width - len(r) if left else 0
        out[i, start:start + len(r)] = torch.tensor(r, dtype=dtype)
    return out


def to_experience(policy: Any, completions: Sequence[Completion], group_size: int, shape: tuple[int, int]) -> Experience:
    """Completions (groups contiguous) -> an Experience on the policy's device, laid out ``shape``."""
    dev, pad = policy.device, policy.pad_token_id
    samples = [completions[g * group_size].sample for g in range(len(completions) // group_size)]
    prompts = policy.encode_prompts([s.prompt for s in samples])
    prompt_ids, prompt_mask = pad_rows(prompts, pad, left=True), pad_rows([[1] * len(p) for p in prompts], left=True)
    ids = pad_rows([c.tokens for c in completions], pad, width=1)
    attn = pad_rows([[1] * len(c.tokens) for c in completions], width=1)
    loss_mask = pad_rows([c.loss_mask for c in completions], dtype=torch.float32, width=1)
    old = pad_rows([c.logprobs for c in completions], dtype=torch.float32, width=1)
    B, L = ids.shape
    rewards = torch.tensor([c.score.reward if c.score else 0.0 for c in completions], dtype=torch.float32).to(dev)
    T, N = shape
    ones, zeros = torch.ones(T, N, device=dev), torch.zeros(T, N, device=dev)
    return Experience(obs={"prompt_ids": prompt_ids.to(dev), "prompt_mask": prompt_mask.to(dev)},
                      actions={"ids": ids.to(dev), "attn": attn.to(dev)}, logprobs=old.to(dev).reshape(T, N, L),
                      values=zeros, rewards=rewards.reshape(T, N), dones=ones, trunc_values=zeros, mask=ones,
                      last_value=torch.zeros(N, device=dev), episode_returns=rewards, group_size=group_size,
                      token_mask=loss_mask.to(dev).reshape(T, N, L), env_steps=B)


def read_pairs(path: str, prompt_key: str, completion_key: str) -> list[tuple[str, str]]:
    rows = read_rows(path, (prompt_key, completion_key), "dataset", "set text.prompt_key / text.completion_key", strings=True)
    return [(row[prompt_key], row[completion_key]) for row in rows]


def read_meta(path: str) -> dict[str, Any]:
    """Provenance written beside a JSONL by `rlinf collect` (``<file>.meta.json``); {} if absent."""
    meta = Path(str(path) + META_SUFFIX)
    if not meta.is_file():
        return {}
    try:
        return json.loads(meta.read_text())
    except ValueError as exc:
        raise UserError(f"'{meta}' is not valid JSON ({exc}); delete or fix it") from exc


def summary_table(rows: dict[str, dict[str, float]], title: str) -> Any:
    from rich.table import Table

    keys = [k for k in ("accuracy", "sampled_accuracy") if any(k in s for s in rows.values())]
    keys += sorted({k for s in rows.values() for k in s if k.startswith("pass@")})
    table = Table(title=title)
    for col in ("model", "prompts", *keys, "reward", "tokens"):
        table.add_column(col, justify="left" if col == "model" else "right")
    for label, s in rows.items():
        if not s:
            table.add_row(label, *["-"] * (len(keys) + 3))
            continue
        table.add_row(label, f"{int(s['prompts'])}", *[f"{s[k]:.1%}" if k in s else "-" for k in keys],
                      f"{s['reward_mean']:.3f}" if "reward_mean" in s else "-",
                      f"{s['completion_tokens_mean']:.1f}" if "completion_tokens_mean" in s else "-")
    return table


def examples_table(completions: Sequence[Completion], n: int, title: str = "examples (greedy)") -> Any:
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    for col in ("prompt", "completion", "answer", "read", "ok"):
        table.add_column(col, overflow="fold")
    for c in list(completions)[:n]:
        table.add_row(_clip(c.sample.prompt), _clip(c.text), _clip(c.sample.answer),
                      _clip(str(c.score.extracted)), "yes" if c.score.correct else "no")
    return table


def _clip(text: str, width: int = 60) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= width else text[: width - 3] + "..."


def examples_json(completions: Sequence[Completion], n: int) -> list[dict[str, Any]]:
    return [{"prompt": c.sample.prompt, "completion": c.text, "answer": c.sample.answer,
             "extracted": c.score.extracted, "correct": bool(c.score.correct)} for c in list(completions)[:n]]


class TextWriter:
    """Appends prompt/completion rows to a JSONL file (one writer at a time), with provenance
    in ``<file>.meta.json``; each append draws new prompts."""

    def __init__(self, path: str, provenance: dict[str, Any]):
        from rlinf_cli.locks import FileLock

        self.path = Path(path)
        if self.path.suffix != ".jsonl":
            raise UserError(f"output '{self.path}': text tasks write a JSONL file; use output=<name>.jsonl")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"cannot create '{self.path.parent}': {exc.strerror}; choose a writable output=...") from exc
        self._lock = FileLock(self.path.with_name(f".{self.path.name}.lock")).acquire(
            blocking=False, busy=f"'{self.path}' is being written by another rlinf collect (pid {{pid}}); wait for it "
                                 f"or choose another output=")
        self.meta = (read_meta(str(self.path)) if self.path.exists() else {}) or {
            "format": "rlinf-text-jsonl", "fields": ["prompt", "completion", "answer", "seed"], "provenance": []}
        self.provenance = dict(provenance)
        self.rows: list[dict[str, Any]] = []
        self.added = 0
        self.meta_path = Path(str(self.path) + META_SUFFIX)

    @property
    def episodes_written(self) -> int:
        return sum(int(p.get("rows", 0)) for p in self.meta["provenance"]) + len(self.rows)

    def seed_key(self) -> int:
        """Appends so far: each draws its prompts from its own seed segment."""
        return len(self.meta["provenance"])

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)

    def close(self) -> None:
        if self.rows:
            with self.path.open("a", encoding="utf-8") as f:
                f.writelines(json.dumps(r) + "\n" for r in self.rows)
            self.meta["provenance"].append({**self.provenance, "rows": len(self.rows)})
            self.meta_path.write_text(json.dumps(self.meta, indent=2))
            self.added += len(self.rows)
            self.rows = []
        self._lock.release()


class TextCollector:
    modality = "text"
    unit = "iterations"  # `rl`'s budget: text.iterations

    def __init__(self, cfg: Any, ctx: Any, sim_node: Any = None):
        self.cfg, self.ctx = cfg, ctx
        node = sim_node if sim_node is not None else cfg.get("sim")
        self.task: TextTask | None = None
        self.label = "jsonl"
        if node is not None and node.get("name"):
            self.task = make_simulator(node)
            if getattr(self.task, "modality", None) != TEXT:
                raise UserError(f"sim '{node.get('name')}' is not a text task")
            self.label = str(node.get("name"))
        self.spec = TEXT_SPEC
        self.text = cfg.get("text") or {}
        self._last = RolloutStats()

    @property
    def new_tokens(self) -> int:
        value = self.text.get("max_new_tokens") if self.text else None
        return int(value) if value else int(self.task.max_new_tokens)

    # -- policies ---------------------------------------------------------------------------
    def policy(self, source: str | None, model_node: Any = None, spec: Any = None, check: bool = True) -> Any:
        from rlinf_cli.policy import load_policy

        if source:
            policy = load_policy(source, self.ctx.device)
            where = f"checkpoint '{source}'"
        else:
            if get_registry().get("model", model_node.name).attrs.get("modality") != TEXT:
                raise UserError(f"model '{model_node.name}' is not a text model; text tasks need model=hf")
            policy = get_registry().load("model", model_node.name)(model_node, TEXT_SPEC).to(self.ctx.device)
            where = "model"
        missing = [m for m in _TEXT_METHODS if not hasattr(policy, m)]
        if missing:
            name = getattr(policy, "config", {}).get("name", type(policy).__name__)
            raise UserError(f"{where}: model '{name}' is not a text model (it lacks {', '.join(missing)}); use model=hf")
        return policy

    def prepare_rl(self, policy: Any, cfg: Any, fresh: bool | None = None) -> None:
        pass

    def actor(self, source: str, deterministic: bool, seed: int) -> Any:
        if source in ("random", "expert"):
            raise UserError(f"{source} is not a policy for text tasks: evaluate a model checkpoint directory "
                            f"(`rlinf collect policy=expert` writes the task's reference solutions)")
        return self.policy(source)

    # -- rl ---------------------------------------------------------------------------------
    def budget(self, cfg: Any) -> int:
        return int(cfg.text.iterations)

    def units(self, state: dict[str, Any]) -> float:
        return float(state["iteration"])

    def start(self, policy: Any, algo: Algorithm, rank: int, world: int, state: dict[str, Any],
              saved: dict[str, np.ndarray] | None) -> list[str]:
        self._rank, self._world = rank, world
        self._spec = algo.rollout_spec()
        self.sampler = torch.Generator(device=policy.device).manual_seed(int(self.cfg.seed) * 1_000_003 + rank)
        if self._spec.kind not in ("steps", "episodes"):
            raise UserError(f"algorithm '{algo.name}' learns from rollout='{self._spec.kind}', which text tasks "
                            f"cannot provide; use a steps or episodes algorithm (--algo grpo, rloo, reinforce++)")
        return []

    def _seeds(self, iteration: int, round_: int, n: int) -> list[int]:
        return training_seeds(int(self.cfg.seed), (iteration * self._world + self._rank) * 64 + round_, n)

    def collect(self, policy: Any, algo: Algorithm, iteration: int) -> Experience:
        spec = self._spec
        t0 = time.perf_counter()
        stats = RolloutStats()
        if spec.kind == "steps":  # T x N one-step episodes of fresh prompts
            T, N = spec.steps, int(self.cfg.num_envs)
            kept = sample_completions(policy, self.task, self.task.prompts(self._seeds(iteration, 0, T * N)), 1,
                                      self.new_tokens, generator=self.sampler)
            stats.seen, stats.prompts_drawn, G, shape = kept, T * N, 1, (T, N)
        else:
            kept, G = self._groups(policy, algo, iteration, spec.groups, spec.group_size, stats), spec.group_size
            shape = (1, len(kept))
        stats.seconds = time.perf_counter() - t0
        stats.generated_tokens = sum(sum(x.loss_mask) for x in stats.seen)
        stats.groups_kept = len(kept) // G
        self._last = stats
        exp = to_experience(policy, kept, G, shape) if kept else None
        if exp is None:  # every group dropped: nothing to learn from this iteration
            exp = Experience({}, {}, torch.zeros(1, 0, 1), *(torch.zeros(1, 0) for _ in range(5)), torch.zeros(0),
                             episode_returns=torch.zeros(0), group_size=G, token_mask=torch.zeros(1, 0, 1))
        exp.env_steps = len(stats.seen)
        return exp

    def _groups(self, policy: Any, algo: Algorithm, iteration: int, groups: int, G: int,
                stats: RolloutStats) -> list[Completion]:
        """``groups`` groups; groups the algorithm filters out are refilled from fresh prompts
        (up to ``algo.refill_rounds()`` extra draws: DAPO's dynamic sampling)."""
        kept: list[Completion] = []
        draw = self._seeds(iteration, 0, groups)
        rounds = algo.refill_rounds()
        for r in range(rounds + 1):
            comps = sample_completions(policy, self.task, self.task.prompts(draw), G, self.new_tokens,
                                       generator=self.sampler)
            stats.seen += comps
            stats.prompts_drawn += len(draw)
            keep = algo.filter_groups(torch.tensor([x.score.reward for x in comps], dtype=torch.float32))
            for g in range(len(draw)):
                if keep is None or bool(keep[g]):
                    kept += comps[g * G:(g + 1) * G]
                else:
                    stats.groups_dropped += 1
            have = len(kept) // G
            if have >= groups or r == rounds:
                break
            draw = self._seeds(iteration, r + 1, groups)[: groups - have]
        return kept[: groups * G]

    def epochs(self, exp: Experience, adv: torch.Tensor, ret: torch.Tensor, algo: Algorithm,
               generator: torch.Generator) -> Iterator[Iterable[MiniBatch]]:
        """Minibatches of whole groups (``minibatch_size`` completions, rounded down to groups):
        a language model encodes a group's prompt once."""
        G = exp.group_size
        B = exp.rewards.numel()
        if not B:  # every group was dropped: nothing to learn from
            return
        n_groups = B // G
        per_mb = max(1, min(n_groups, algo.minibatch_size // G))
        loss_mask = exp.token_mask.reshape(B, -1)
        old = exp.logprobs.reshape(B, -1)
        adv_tok = adv.reshape(B).unsqueeze(1) * loss_mask
        ret, values = ret.reshape(B), exp.values.reshape(B)
        ref = None if exp.ref_logprobs is None else exp.ref_logprobs.reshape(B, -1)
        obs, act = exp.obs, exp.actions

        def epoch() -> Iterator[MiniBatch]:
            perm = torch.randperm(n_groups, generator=generator)
            for start in range(0, n_groups, per_mb):
                g = perm[start:start + per_mb]
                rows = (g.unsqueeze(1) * G + torch.arange(G)).reshape(-1).to(adv_tok.device)
                yield MiniBatch(old[rows], adv_tok[rows], ret[rows], values[rows], loss_mask[rows],
                                None if ref is None else ref[rows],
                                obs={k: v[g.to(v.device)] for k, v in obs.items()},
                                actions={k: v[rows] for k, v in act.items()})

        for _ in range(algo.epochs):
            yield epoch()

    @torch.no_grad()
    def logprobs(self, policy: Any, exp: Experience) -> torch.Tensor:
        out = policy.evaluate(exp.obs, exp.actions, with_entropy=False)
        return out.logprob.reshape(exp.logprobs.shape)

    def metrics(self, exp: Experience, seconds: float = 0.0) -> dict[str, float]:
        """Rollout numbers of ``exp``, which took ``seconds`` to sample and learn from."""
        s, seen = self._last, self._last.seen
        rewards = [x.score.reward for x in seen]
        return {"rollout/reward_mean": sum(rewards) / max(len(rewards), 1), "rollout/accuracy": accuracy(seen),
                "rollout/completion_tokens_mean": s.generated_tokens / max(len(seen), 1),
                "rollout/generated_tokens": float(s.generated_tokens),
                "rollout/groups_dropped": float(s.groups_dropped), "rollout/groups_kept": float(s.groups_kept),
                "time/env_steps_per_s": len(seen) / max(seconds, 1e-9),
                "time/generated_tokens_per_s": s.generated_tokens / max(seconds, 1e-9)}

    def info(self, metrics: dict[str, float]) -> str:
        return f"reward {metrics['rollout/reward_mean']:.3f}  acc {metrics['rollout/accuracy']:.0%}"

    def state(self) -> dict[str, np.ndarray]:
        return {}

    def close(self) -> None:
        pass

    # -- evaluation -------------------------------------------------------------------------
    def check_video(self, video: int, size: int) -> None:
        if video:
            raise UserError("text tasks have no video to record: use video=0")

    def evaluate(self, policy: Any, episodes: int, seed: int, deterministic: bool = True, label: str = "policy",
                 on_batch: Callable[[int], None] | None = None, pass_k: int = 0, batch: int = 64,
                 generator: Any = None, examples: int = 8, **_embodied: Any) -> Evaluation:
        """Greedy pass@1 (``accuracy``) on prompts ``seed .. seed+episodes-1``; sampled pass@k
        with ``pass_k`` > 0 (a prompt counts solved when any of k samples is correct;
        ``sampled_accuracy`` is the mean correctness of those samples)."""
        if isinstance(policy, str):
            policy = self.actor(policy, deterministic, seed)
        if episodes < 1 or self.task is None:
            return Evaluation({}, {label: {}}, {}, {"examples": []})
        samples = self.task.prompts([seed + i for i in range(episodes)])
        greedy: list[Completion] = []
        solved = sampled_correct = 0
        if pass_k > 0 and generator is None:
            generator = torch.Generator(device=policy.device).manual_seed(int(seed))
        for start in range(0, episodes, batch):
            chunk = samples[start:start + batch]
            greedy += sample_completions(policy, self.task, chunk, 1, self.new_tokens, greedy=True)
            if pass_k > 0:
                comps = sample_completions(policy, self.task, chunk, pass_k, self.new_tokens, generator=generator)
                ok = np.array([bool(c.score.correct) for c in comps]).reshape(len(chunk), pass_k)  # [prompt, sample]
                solved += int(ok.any(axis=1).sum())
                sampled_correct += int(ok.sum())
            if on_batch is not None:
                on_batch(len(chunk))
        summary = {"prompts": float(episodes), "accuracy": accuracy(greedy),
                   "reward_mean": sum(c.score.reward for c in greedy) / episodes,
                   "completion_tokens_mean": sum(sum(c.loss_mask) for c in greedy) / episodes}
        if pass_k > 0:
            summary[f"pass@{pass_k}"] = solved / episodes
            summary["sampled_accuracy"] = sampled_correct / (episodes * pass_k)
        return Evaluation(summary, {label: summary}, {f"eval/{k}": v for k, v in summary.items()},
                          {"examples": examples_json(greedy, examples)},
                          examples_table(greedy, examples) if examples > 0 else None)

    def table(self, rows: dict[str, dict[str, float]], title: str) -> Any:
        return summary_table(rows, title)

    # -- datasets (sft) and demonstrations (collect) ----------------------------------------------
    def dataset(self, path: str, val_fraction: float, seed: int) -> Any:
        from rlinf_cli.collectors.datasets import TextDataset

        return TextDataset(path, val_fraction, seed, self.ctx.device, self.cfg.text)

    def writer(self, output: str, provenance: dict[str, Any], chunk: int) -> TextWriter:
        return TextWriter(output, provenance)

    def demos_summary(self, kept: Sequence[dict[str, Any]]) -> dict[str, float]:
        return {"prompts": float(len(kept)), "accuracy": float(np.mean([r.get("correct", True) for r in kept]))
                if kept else 0.0}

    def record(self, writer: TextWriter, source: str, want: int, only_success: bool, progress: Any) -> list[Any]:
        """Rows for `sft`: the task's reference solutions (``expert``) or a checkpoint's sampled
        completions (``only_success`` keeps correct ones: rejection sampling)."""
        samples = self.task.prompts(training_seeds(int(self.cfg.seed), writer.seed_key(), want))
        if source == "expert":
            for s in samples:
                writer.add({"prompt": s.prompt, "completion": s.solution, "answer": s.answer, "seed": s.seed})
            progress.update(len(samples))
            return list(writer.rows)
        policy = self.policy(source)
        k = int(self.text.get("samples", 1))
        gen = torch.Generator(device=policy.device).manual_seed(int(self.cfg.seed))
        for start in range(0, want, 64):
            chunk = samples[start:start + 64]
            for c in sample_completions(policy, self.task, chunk, k, self.new_tokens,
                                        greedy=bool(self.cfg.deterministic) and k == 1, generator=gen):
                if c.score.correct or not only_success:
                    writer.add({"prompt": c.sample.prompt, "completion": c.text, "answer": c.sample.answer,
                                "seed": c.sample.seed, "correct": bool(c.score.correct)})
            progress.update(len(chunk))
        return list(writer.rows)

    def describe(self) -> str:
        return self.label


def provenance_sim(path: str) -> tuple[dict[str, Any] | None, str | None]:
    """The text task a JSONL written by `rlinf collect` came from: (sim node, sim choice)."""
    prov = (read_meta(path).get("provenance") or [{}])[-1]
    sim = prov.get("sim")
    return (plain(sim) if sim else None), prov.get("sim_choice", (sim or {}).get("name"))
