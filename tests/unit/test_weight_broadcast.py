"""Weight sync by broadcast (runtime/weight_broadcast.py): a trainer (rank 0) and two receivers in a
gloo group of their own; tensors of two dtypes travel packed, one buffer per dtype, and arrive equal
bit for bit, twice (a second version over the same group); a receiver whose tensors differ is refused."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from rlinf_cli.runtime.weight_broadcast import FlatBuffers, GroupAddress, Sender, check_layout, free_port, layout_of


def _tensors(version: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(version)
    return {"a.weight": torch.randn(3, 5, generator=g), "b.bias": torch.randn(7, generator=g).to(torch.bfloat16),
            "c.weight": torch.randn(2, 2, 2, generator=g)}


def _receive(address: GroupAddress, rank: int, out: "mp.Queue") -> None:
    from rlinf_cli.runtime.weight_broadcast import Receiver

    receiver = Receiver(address, rank, "cpu")
    for _ in range(2):
        out.put((rank, {k: v.clone() for k, v in receiver.receive().items()}))


def test_two_versions_reach_every_receiver_bit_for_bit():
    layout = layout_of(_tensors(0))
    address = GroupAddress("127.0.0.1", free_port("127.0.0.1"), 3, "gloo", 60.0, layout)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_receive, args=(address, r, out)) for r in (1, 2)]
    for p in procs:
        p.start()
    try:
        sender = Sender(address, "cpu")
        sender.open()
        for version in (1, 2):
            sender.send(_tensors(version))
            for _ in range(2):
                rank, got = out.get(timeout=60)
                assert list(got) == list(_tensors(version)), rank
                for name, t in _tensors(version).items():
                    assert got[name].dtype == t.dtype and torch.equal(got[name], t), (rank, name, version)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert [p.exitcode for p in procs] == [0, 0]


def test_buffers_are_one_per_dtype_with_views_in_place():
    flat = FlatBuffers(layout_of(_tensors(0)), "cpu")
    assert sorted(flat.buffers) == ["bfloat16", "float32"] and flat.buffers["float32"].numel() == 15 + 8
    flat.views["c.weight"].fill_(1.0)
    assert flat.buffers["float32"][15:].eq(1.0).all() and not flat.buffers["float32"][:15].eq(1.0).all()


def test_a_receiver_with_other_tensors_is_refused():
    mine = layout_of(_tensors(0))
    theirs = [*mine[:-1], ("c.weight", "float32", (2, 4))]
    with pytest.raises(RuntimeError, match="trainable tensors differ from the trainer's: .*c.weight"):
        check_layout(mine, theirs)
    check_layout(mine, list(mine))


def _receive_once(address: GroupAddress, rank: int, out: "mp.Queue") -> None:
    from rlinf_cli.runtime.weight_broadcast import Receiver

    receiver = Receiver(address, rank, "cpu")
    out.put(("joined", rank))
    try:
        receiver.receive()
        out.put(("received", rank))
    except RuntimeError as exc:
        out.put(("failed", str(exc)[:200]))


def test_a_member_lost_before_a_broadcast_fails_it_and_the_trainer_leaving_frees_the_rest():
    """What the pool's restart relies on: the trainer's side raises when a worker died (here before
    the broadcast), and once the trainer leaves the group the live worker's side raises too, long
    before its own wait would time out (a group that failed cannot be reused).

    How soon the trainer's side raises is gloo's: at once when its connection loop has seen the
    dead member's socket close (1-4 ms in each of 20 runs here, also with the CPU saturated), but
    in one CI run of the whole suite it raised only at the group's timeout. So the bound asserted
    for the send is that timeout (20 s, and the group timeout is the setting that bounds a run's
    wait: ``runtime.worker_timeout_s``); the live member's side, which waits on the closed
    connections and not on gloo's timeout, is held to well below it.

    Each receiver reports on a queue of its own: a process killed just after its ``put`` can die
    holding a shared queue's write lock (its feeder thread had not released it yet), and the live
    member's report then never leaves its process (seen here 2 times in 10 under CPU load, and
    in CI). The pool talks to each worker over a pipe of its own for the same reason."""
    import time

    timeout_s = 20.0
    address = GroupAddress("127.0.0.1", free_port("127.0.0.1"), 3, "gloo", timeout_s, layout_of(_tensors(0)))
    ctx = mp.get_context("spawn")
    outs = [ctx.Queue() for _ in (1, 2)]
    procs = [ctx.Process(target=_receive_once, args=(address, r, out)) for r, out in zip((1, 2), outs)]
    for p in procs:
        p.start()
    try:
        sender = Sender(address, "cpu")
        sender.open()
        assert [out.get(timeout=60) for out in outs] == [("joined", 1), ("joined", 2)]
        procs[1].kill()
        procs[1].join(timeout=30)
        t0 = time.monotonic()
        with pytest.raises(RuntimeError):
            sender.send(_tensors(1))
            # gloo may hand the buffer to a live peer first; the next version cannot reach the dead one
            sender.send(_tensors(2))
        assert time.monotonic() - t0 < timeout_s + 10  # ends at the latest at the timeout, never hangs
        sender.close()  # the live member's side of the failed broadcast fails now too
        t0 = time.monotonic()
        state, message = outs[0].get(timeout=60)
        # a real bound in the usual case (the send failed within milliseconds); where gloo took its
        # timeout for the send, the live member's own wait has run out too and this only checks the state
        assert state == "failed" and time.monotonic() - t0 < timeout_s / 2, (state, message)
        procs[0].join(timeout=30)
        assert procs[0].exitcode == 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
