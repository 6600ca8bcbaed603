"""The env server's messages: msgpack maps and lists, arrays as raw bytes with dtype and shape.

Why msgpack and not pickle: a message from the network must never run code when decoded.
msgpack decodes to plain values only; arrays travel as an extension type holding
``[dtype, shape, raw bytes]``, and :func:`unpack` accepts only numeric dtypes and byte counts
that match the shape, so a malformed message fails here, in the server's network thread, and
never reaches a simulator. gRPC frames the messages (one gRPC message = one msgpack value).

Observations keep the worker's codec (:mod:`rlinf_cli.runtime.codec`): a step reply carries
:class:`~rlinf_cli.runtime.codec.Packed` arrays whose data is lz4/zstd bytes (or a raw array for
``obs_compression=none``), encoded in the server's worker process and decoded by the client's
:class:`~rlinf_cli.runtime.workers.WorkerVecEnv` like any local worker's reply.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlinf_cli.runtime.codec import TEXT_DTYPE, Packed
from rlinf_cli.runtime.env_worker import Reply

PROTOCOL = 1
SERVICE = "rlinf.env.v1.EnvServer"
INFO = f"/{SERVICE}/Info"  # unary: what the server serves (spec, expert, cores)
SESSION = f"/{SERVICE}/Session"  # bidirectional stream: one client session = one EnvWorker
EXPERT = f"/{SERVICE}/Expert"  # bidirectional stream: the simulator's scripted expert
TOKEN_KEY = "rlinf-token"  # gRPC metadata key of the shared secret
TOKEN_ENV = "RLINF_ENV_TOKEN"  # environment variable read by server and client when no token is given

# HTTP/2 flow control as gRPC sets it by default (64 KiB windows grown by bandwidth probes, 16 KiB
# frames) costs extra round trips on every message above ~64 KiB: an observation batch of pixels
# is one. Measured on this machine (benchmarks/remote_env.py): a 60 KB request/reply round trip took
# 1.08 ms with the defaults and 0.28 ms with a fixed 16 MiB window and large frames.
HTTP2_OPTIONS = [("grpc.http2.lookahead_bytes", 16 << 20), ("grpc.http2.max_frame_size", (1 << 24) - 1),
                 ("grpc.http2.bdp_probe", 0)]

_ND, _PACKED, _REPLY, _TUPLE, _TEXT = 1, 2, 3, 4, 5
MAX_DIMS = 8


class WireError(ValueError):
    """A message that does not decode, or decodes to something the protocol does not allow."""


def _default(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        if x.dtype == object:  # text entries: the strings themselves (msgpack str), never pickle
            values = x.ravel().tolist()
            if not all(isinstance(v, str) for v in values):
                raise TypeError("object arrays cross the wire only as text entries (strings)")
            return _ext(_TEXT, [list(x.shape), values])
        if x.dtype.kind not in "biuf":
            raise TypeError(f"arrays of dtype {x.dtype} cannot cross the wire")
        return _ext(_ND, [x.dtype.str, list(x.shape), memoryview(np.ascontiguousarray(x)).cast("B")])
    if isinstance(x, Reply):
        return _ext(_REPLY, list(x))
    if isinstance(x, Packed):
        return _ext(_PACKED, [list(x.shape), x.dtype, bool(x.delta), x.data, int(x.nbytes)])
    if isinstance(x, tuple):
        return _ext(_TUPLE, list(x))
    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(f"cannot send a {type(x).__name__} over the wire")


def _ext(code: int, value: Any) -> Any:
    import msgpack

    return msgpack.ExtType(code, pack(value))


def pack(obj: Any) -> bytes:
    """Encode a message: None, bool, int, float, str, bytes, lists, str-keyed dicts, tuples,
    numeric numpy arrays and scalars, :class:`Packed`, :class:`Reply`."""
    import msgpack

    return msgpack.packb(obj, default=_default, use_bin_type=True, strict_types=True)


def _dtype(name: Any) -> np.dtype:
    if not isinstance(name, str) or len(name) > 8:
        raise WireError(f"bad dtype {name!r}")
    try:
        dt = np.dtype(name)
    except TypeError:
        raise WireError(f"bad dtype {name!r}") from None
    if dt.kind not in "biuf" or dt.itemsize > 8:
        raise WireError(f"dtype {name!r} is not allowed (numeric arrays only)")
    return dt


def _shape(shape: Any) -> tuple[int, ...]:
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(type(d) is int and 0 <= d < 2**31 for d in shape):
        raise WireError(f"bad array shape {shape!r}")
    return tuple(shape)


def _ext_hook(code: int, data: bytes) -> Any:
    value = unpack(data)
    if code == _ND:
        if not (isinstance(value, list) and len(value) == 3 and isinstance(value[2], bytes)):
            raise WireError("bad array record")
        dt, shape = _dtype(value[0]), _shape(value[1])
        if int(np.prod(shape, dtype=np.int64)) * dt.itemsize != len(value[2]):
            raise WireError(f"array of shape {shape} and dtype {dt} does not match its {len(value[2])} bytes")
        return np.frombuffer(value[2], dtype=dt).reshape(shape)
    if code == _PACKED:
        if not (isinstance(value, list) and len(value) == 5 and isinstance(value[3], (bytes, np.ndarray))
                and type(value[4]) is int and 0 <= value[4] < 2**31):
            raise WireError("bad packed observation record")
        if value[1] != TEXT_DTYPE:
            _dtype(value[1])
        return Packed(_shape(value[0]), value[1], bool(value[2]), value[3], value[4])
    if code == _TEXT:
        if not (isinstance(value, list) and len(value) == 2 and isinstance(value[1], list)
                and all(isinstance(v, str) for v in value[1])):
            raise WireError("bad text record")
        shape = _shape(value[0])
        if int(np.prod(shape, dtype=np.int64)) != len(value[1]):
            raise WireError("text record does not match its shape")
        out = np.empty(len(value[1]), dtype=object)
        out[:] = value[1]
        return out.reshape(shape)
    if code == _REPLY:
        if not (isinstance(value, list) and len(value) == len(Reply._fields)):
            raise WireError("bad reply record")
        return Reply(*value)
    if code == _TUPLE:
        if not isinstance(value, list):
            raise WireError("bad tuple record")
        return tuple(value)
    raise WireError(f"unknown extension type {code}")


def unpack(data: bytes) -> Any:
    """Decode a message; anything malformed raises :class:`WireError` (never another exception)."""
    import msgpack

    try:
        return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=True, use_list=True)
    except WireError:
        raise
    except Exception as exc:  # msgpack's own errors, recursion limits, bad UTF-8 ...
        raise WireError(f"{type(exc).__name__}: {exc}") from None
