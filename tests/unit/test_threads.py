"""train.threads: auto keeps small policies on one thread and gives large ones every core."""

import pytest
import torch

from rlinf_cli.runtime import threads


@pytest.fixture(autouse=True)
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


class Params(torch.nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.w = torch.nn.Parameter(torch.empty(n), requires_grad=False)


def test_parse_and_initial():
    assert threads.parse("auto") is None and threads.parse(None) is None and threads.parse(" AUTO ") is None
    assert threads.parse(3) == 3 and threads.initial("auto") == 1 and threads.initial(4) == 4


def test_auto_gives_a_large_policy_every_core_of_its_rank(monkeypatch):
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    torch.set_num_threads(1)
    assert threads.fit(Params(threads.LARGE_MODEL - 1), "auto") == 1
    assert threads.fit(Params(threads.LARGE_MODEL), "auto") == 4
    torch.set_num_threads(1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # two torchrun ranks share the machine's cores
    assert threads.fit(Params(threads.LARGE_MODEL), "auto") == 2


def test_a_set_number_is_kept_whatever_the_model(monkeypatch):
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    torch.set_num_threads(1)
    assert threads.fit(Params(threads.LARGE_MODEL), 1) == 1
    assert threads.fit(object(), "auto") == 1  # not a torch module: nothing to count
