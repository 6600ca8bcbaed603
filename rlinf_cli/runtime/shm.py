"""Named tensors in shared memory, packed into one flat buffer per dtype.

A worker process on this machine reads a policy's weights from shared memory instead of being
sent them. Sharing each tensor on its own costs one file descriptor per tensor when the mapping
is pickled to a ``forkserver``/``spawn`` child, and Python's forkserver sends at most 256
(``multiprocessing.forkserver.MAXFDS_TO_SEND``): a 30-layer transformer has more parameters
than that, and starting its worker failed with ``ValueError: too many fds``. Packed, a mapping
travels as one descriptor per dtype (one or two), whatever the model; each side rebuilds the same
views into the buffers.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any


class SharedTensors(Mapping):
    """A read-mostly mapping ``name -> tensor`` whose tensors are views into shared buffers.

    Pickled (through ``torch.multiprocessing``'s reductions) it sends only the buffers and the
    layout; writes on one side are seen by the other (callers order them: writer writes only while
    no reader runs).
    """

    def __init__(self, tensors: Mapping[str, Any]):
        import torch

        sizes: dict[Any, int] = {}
        layout: list[tuple[str, Any, int, tuple[int, ...]]] = []
        for name, t in tensors.items():
            offset = sizes.get(t.dtype, 0)
            layout.append((name, t.dtype, offset, tuple(t.shape)))
            sizes[t.dtype] = offset + t.numel()
        self._buffers = {dtype: torch.empty(n, dtype=dtype).share_memory_() for dtype, n in sizes.items()}
        self._layout = layout
        self._views = self._build_views()
        with torch.no_grad():
            for name, t in tensors.items():
                self._views[name].copy_(t.detach())

    def _build_views(self) -> dict[str, Any]:
        return {name: self._buffers[dtype][offset:offset + math.prod(shape)].view(shape)
                for name, dtype, offset, shape in self._layout}

    def write(self, tensors: Mapping[str, Any]) -> None:
        """Copy ``tensors`` (the same names, a subset allowed) into the shared buffers."""
        import torch

        with torch.no_grad():
            for name, t in tensors.items():
                self._views[name].copy_(t)

    def __getstate__(self) -> dict[str, Any]:
        return {"buffers": self._buffers, "layout": self._layout}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._buffers, self._layout = state["buffers"], state["layout"]
        self._views = self._build_views()

    def __getitem__(self, name: str) -> Any:
        return self._views[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._views)

    def __len__(self) -> int:
        return len(self._views)
