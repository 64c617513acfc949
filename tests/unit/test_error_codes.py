"""Every error shardq raises on purpose reaches a caller with its gRPC code, never INTERNAL."""

from __future__ import annotations

import importlib
import pkgutil

import grpc

import shardq
from shardq.common import errors as e
from shardq.common.redis import NotReplicated
from shardq.coordinator.errors import CODES, item_code


def _subclasses(cls: type[e.ShardqError]) -> set[type[e.ShardqError]]:
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub, *_subclasses(sub)}
    return out


def test_every_shardq_error_class_has_its_code() -> None:
    # Import every module of shardq (what the servers run), so every subclass is defined.
    for info in pkgutil.walk_packages(shardq.__path__, "shardq."):
        if not info.name.endswith("__main__") and ".migrations" not in info.name:
            importlib.import_module(info.name)
    missing = sorted(c.__qualname__ for c in _subclasses(e.ShardqError) if not CODES.get(c))
    assert not missing, f"answered INTERNAL: {missing}"


def test_a_write_its_replicas_did_not_confirm_is_unavailable_not_internal() -> None:
    exc = NotReplicated("the shard's write was acknowledged by 0 of 1 replica(s)")
    assert item_code(exc) == grpc.StatusCode.UNAVAILABLE.value[0]
    assert CODES.get(type(exc)) is grpc.StatusCode.UNAVAILABLE
    assert CODES.get(ValueError) is None  # not ours: no code
