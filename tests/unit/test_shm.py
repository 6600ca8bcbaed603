"""Shared tensors reach a forkserver child as one descriptor per dtype, whatever their number."""

import multiprocessing.forkserver

import torch
import torch.multiprocessing as tmp

from rlinf_cli.runtime.shm import SharedTensors


def _child(shared, conn):
    conn.send((len(shared), float(shared["w150"].sum()), shared["steps"].dtype == torch.int64))
    shared["w0"].fill_(7.0)  # the parent sees it: the same memory
    conn.close()


def test_more_tensors_than_forkserver_can_send_descriptors_for():
    n = multiprocessing.forkserver.MAXFDS_TO_SEND + 44  # one descriptor per tensor would be refused
    tensors = {f"w{i}": torch.full((3, 2), float(i)) for i in range(n)}
    tensors["steps"] = torch.tensor([5, 6], dtype=torch.int64)
    shared = SharedTensors(tensors)
    ctx = tmp.get_context("forkserver")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_child, args=(shared, child))
    proc.start()
    got = parent.recv()
    proc.join(timeout=60)
    assert proc.exitcode == 0
    assert got == (n + 1, 150.0 * 6, True)
    assert torch.equal(shared["w0"], torch.full((3, 2), 7.0))
    assert torch.equal(shared["w3"], tensors["w3"]) and torch.equal(shared["steps"], tensors["steps"])


def test_write_updates_the_views_in_place():
    shared = SharedTensors({"a": torch.zeros(2, 2), "b": torch.zeros(3)})
    view = shared["a"]
    shared.write({"a": torch.ones(2, 2)})
    assert torch.equal(view, torch.ones(2, 2)) and torch.equal(shared["b"], torch.zeros(3))
