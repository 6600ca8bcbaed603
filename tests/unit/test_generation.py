"""Generation workers' driver side, without processes: how a request is split, which tensors travel,
what an executor must provide."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rlinf_cli.api import TextSample
from rlinf_cli.collectors.text_gen import TextGeneration, _generator, split, state_of
from rlinf_cli.errors import UserError
from rlinf_cli.runtime.gen_worker import SharedWeights, trainable
from rlinf_cli.runtime.generation import GenerationPlacement, GenerationPool, sync_mode


def test_split_is_contiguous_and_even():
    assert split(8, 2) == [(0, 4), (4, 8)]
    assert split(5, 2) == [(0, 3), (3, 5)]
    assert split(3, 4) == [(0, 1), (1, 2), (2, 3)]  # never an empty part
    assert split(1, 2) == [(0, 1)]


class _Pool:
    """Records requests instead of sending them."""

    num_workers = 2

    def __init__(self):
        self.sent = []

    def publish(self, policy, version):
        pass

    def submit(self, payloads):
        self.sent.append(payloads)
        return payloads


class _TextPolicy:
    """Prompts are their characters; ``generate`` takes ``part=`` unless told otherwise."""

    def __init__(self, parts: bool = True):
        if parts:
            self.generate = lambda prompts, *, samples, part=None, **kw: None
        else:
            self.generate = lambda prompts, *, samples, **kw: None

    def encode_prompts(self, texts):
        return [list(t.encode()) for t in texts]


def _requests(prompts, *, exact=True, turns=1, parts=True):
    pool = _Pool()
    gen = TextGeneration(pool, SimpleNamespace(max_turns=turns), SimpleNamespace(schemas=[]), exact)
    samples = [TextSample(p, "") for p in prompts]
    gen.submit(_TextPolicy(parts), samples, 4, 8, False, torch.Generator().manual_seed(0), 0)
    return pool.sent[-1]


def test_an_exact_request_splits_only_where_each_part_samples_the_whole_batchs_bits():
    padded = _requests(["1+2=", "10+20=", "3+4=", "5+66="])
    assert sorted(padded) == [0, 1]
    assert [len(r.samples) for r in padded.values()] == [2, 2]
    assert padded[1].part == (8, 16, 6, True)  # rows 8.. of 16; the longest prompt has 6 tokens, some fewer
    assert padded[0].state == padded[1].state  # both parts start from the trainer's sampler state
    # one prompt length (no padding: attention skips its mask until a row ends, anywhere), tool turns,
    # a model without part=: the whole request on one worker, as the trainer would sample it
    for request in (_requests(["1+2=", "3+4="]), _requests(["1+2=", "10+20="], turns=3),
                    _requests(["1+2=", "10+20="], parts=False)):
        assert len(request) == 1 and request[next(iter(request))].part is None


def test_a_stale_request_always_splits():
    assert [r.part.first for r in _requests(["1+2=", "3+4="], exact=False).values()] == [0, 4]
    streams = _requests(["1+2=", "3+4="], exact=False, parts=False)  # no part=: a stream of its own each
    assert [r.stream for r in streams.values()] == [0, 1] and all(r.part is None for r in streams.values())


def test_own_streams_differ_and_a_state_travels_exactly():
    g = torch.Generator().manual_seed(5)
    state = state_of(g)
    assert torch.equal(_generator("cpu", state).get_state(), g.get_state())
    a, b = _generator("cpu", state, 0), _generator("cpu", state, 1)
    assert not torch.equal(torch.rand(4, generator=a), torch.rand(4, generator=b))


def test_with_lora_only_the_adapter_travels():
    from rlinf_model_hf.model import HFCausalLM

    tiny = {"name": "hf", "hidden_size": 32, "layers": 1, "heads": 2, "kv_heads": 1, "intermediate_size": 64}
    full = HFCausalLM(tiny)
    lora = HFCausalLM({**tiny, "lora": {"r": 2}})
    lora.add_critic()
    assert set(trainable(full)) == {n for n, _ in full.named_parameters()}  # full fine-tuning: every weight
    names = set(SharedWeights(lora).tensors)
    assert names and all("lora_" in n or n.startswith("value_head.") for n in names)
    assert any(n.startswith("value_head.") for n in names)
    assert sum(p.numel() for n, p in lora.named_parameters() if n in names) < \
        sum(p.numel() for p in lora.parameters()) / 10


class _Executor:
    name = "plain"
    shared_memory = False


def test_an_executor_without_generation_workers_is_refused_in_one_line():
    policy = SimpleNamespace(device="cpu")
    runtime = SimpleNamespace(start_method="forkserver", max_restarts=3)
    with pytest.raises(UserError, match="executor=plain does not start generation workers: use executor=local or "
                                        "executor=ray, or placement.generation.workers=0"):
        GenerationPool(_Executor(), policy, None, GenerationPlacement(workers=2), runtime, 0, 1)
    starts = type("Starts", (_Executor,), {"start_generation_workers": lambda self, plan: []})
    with pytest.raises(UserError, match="has no object store to send them weights .*sync=broadcast"):
        GenerationPool(starts(), policy, None, GenerationPlacement(workers=2), runtime, 0, 1)


def test_sync_modes_and_what_each_needs():
    assert sync_mode("auto", True, False, "local") == "shared_memory"
    assert sync_mode("auto", False, True, "ray") == "object_store"
    assert sync_mode("broadcast", True, False, "local") == "broadcast"
    assert sync_mode("broadcast", False, False, "plain") == "broadcast"  # a group needs no executor support
    with pytest.raises(UserError, match="sync=shared_memory needs workers on this machine"):
        sync_mode("shared_memory", False, True, "ray")
    with pytest.raises(UserError, match="sync=object_store needs an executor with an object store .*executor=local has none"):
        sync_mode("object_store", True, False, "local")
    with pytest.raises(ValueError, match="placement.generation.sync must be one of"):
        GenerationPlacement(workers=1, sync="nccl")


def test_placement_bounds():
    with pytest.raises(ValueError, match="workers must be >= 0"):
        GenerationPlacement(workers=-1)
    with pytest.raises(ValueError, match="must be >= 0"):
        GenerationPlacement(workers=1, cpus=-1)


class _Handle:
    """A generation worker's handle whose side of the next broadcast (once) is lost with the worker."""

    def __init__(self, dies: bool):
        self.dies, self.calls, self.restarted = dies, [], 0

    def submit(self, method, *args):
        self.calls.append(method)
        return len(self.calls) - 1

    def result(self, ticket):
        from rlinf_cli.runtime.workers import WorkerDied

        if self.calls[ticket] == "receive_weights" and self.dies:
            self.dies = False
            raise WorkerDied("process 42 exited with code -9")
        return 0.0

    def restart(self):
        self.restarted += 1


class _Sender:
    failing = False
    opened = 0

    def __init__(self, address, device):
        self.address = address

    def open(self):
        _Sender.opened += 1

    def close(self):
        self.closed = True

    def send(self, tensors):
        if _Sender.failing:
            _Sender.failing = False
            raise RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:2475")


def _broadcast_pool(handles, max_restarts=3):
    import rlinf_cli.runtime.generation as generation

    pool = object.__new__(generation.GenerationPool)
    pool.sync, pool.handles, pool.known, pool.version = "broadcast", handles, [0] * len(handles), 0
    pool.plan = type("Plan", (), {"version": 0})()
    pool.restarts, pool.max_restarts = [0] * len(handles), max_restarts
    pool.stats = {"restarts": 0.0, "sync_s": 0.0}
    pool._host, pool._timeout_s, pool._backend, pool._device, pool._layout = "127.0.0.1", 5.0, "gloo", "cpu", []
    pool.sender, pool._policy = None, torch.nn.Linear(2, 2)
    return pool


def test_a_worker_lost_during_a_weight_broadcast_is_restarted_and_the_group_formed_again(monkeypatch, capsys):
    import rlinf_cli.runtime.generation as generation

    monkeypatch.setattr(generation, "Sender", _Sender)
    monkeypatch.setattr(generation, "free_port", lambda host: 1234)
    handles = [_Handle(dies=False), _Handle(dies=True)]
    pool = _broadcast_pool(handles)
    pool._sync_group()  # forms the group; nothing to send at version 0
    assert _Sender.opened == 1 and [h.calls for h in handles] == [["join_weights"]] * 2
    pool.version, _Sender.failing = 1, True  # version 1: worker 1 dies mid-broadcast, the trainer's side fails
    pool._sync_group()
    assert [h.restarted for h in handles] == [0, 1] and pool.stats["restarts"] == 1.0
    assert _Sender.opened == 2  # the group formed again with the fresh worker
    assert [h.calls for h in handles] == [["join_weights", "receive_weights", "join_weights", "receive_weights"]] * 2
    assert pool.known == [1, 1] and pool.sender is not None
    assert capsys.readouterr().err.count("warning: generation worker 1 died") == 1


def test_a_weight_broadcast_failing_with_every_worker_alive_is_one_line(monkeypatch):
    import rlinf_cli.runtime.generation as generation

    monkeypatch.setattr(generation, "Sender", _Sender)
    monkeypatch.setattr(generation, "free_port", lambda host: 1234)
    pool = _broadcast_pool([_Handle(dies=False)])
    pool._sync_group()
    pool.version, _Sender.failing = 1, True
    with pytest.raises(generation.GenerationError, match="weight broadcast to the generation workers failed with every "
                                                         "worker alive: .*Connection closed by peer"):
        pool._sync_group()
