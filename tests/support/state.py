"""Whole-keyspace snapshots, so table-driven tests can assert the entire state a script left."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis


def _d(b: bytes) -> str:
    return b.decode("utf-8", "backslashreplace")


async def dump(redis: Redis) -> dict[str, Any]:
    """Every key with its value: str, dict (hash), list, set, or list of (member, score).

    TTLs are left out (see :func:`ttls`); values are decoded to str for readable diffs.
    """
    r: Any = redis
    out: dict[str, Any] = {}
    for raw_key in sorted(await r.keys("*")):
        key = _d(raw_key)
        kind = _d(await r.type(raw_key))
        if kind == "string":
            out[key] = _d(await r.get(raw_key))
        elif kind == "hash":
            out[key] = {_d(k): _d(v) for k, v in (await r.hgetall(raw_key)).items()}
        elif kind == "list":
            out[key] = [_d(v) for v in await r.lrange(raw_key, 0, -1)]
        elif kind == "set":
            out[key] = {_d(v) for v in await r.smembers(raw_key)}
        elif kind == "zset":
            out[key] = [(_d(m), s) for m, s in await r.zrange(raw_key, 0, -1, withscores=True)]
        else:  # pragma: no cover - shardq uses no other types
            raise AssertionError(f"unexpected type {kind} for {key}")
    return out


async def ttls(redis: Redis) -> dict[str, int]:
    """Keys that expire, with their remaining TTL in ms."""
    r: Any = redis
    out = {}
    for raw_key in sorted(await r.keys("*")):
        ttl = await r.pttl(raw_key)
        if ttl >= 0:
            out[_d(raw_key)] = ttl
    return out


#: Reads the whole keyspace in one round trip: {key, type, value} per key.
_SNAPSHOT_LUA = """
local out = {}
for _, k in ipairs(redis.call('KEYS', '*')) do
  local t = redis.call('TYPE', k)['ok']
  local v
  if t == 'string' then v = redis.call('GET', k)
  elseif t == 'hash' then v = redis.call('HGETALL', k)
  elseif t == 'list' then v = redis.call('LRANGE', k, 0, -1)
  elseif t == 'set' then v = redis.call('SMEMBERS', k)
  else v = redis.call('ZRANGE', k, 0, -1, 'WITHSCORES') end
  out[#out + 1] = {k, t, v}
end
return out
"""


async def snapshot(redis: Redis) -> dict[str, Any]:
    """What :func:`dump` reads, in one round trip (for tests that read it after every step);
    zset scores as int."""
    r: Any = redis
    out: dict[str, Any] = {}
    for k, raw_kind, v in await r.eval(_SNAPSHOT_LUA, 0):
        key, kind = _d(k), _d(raw_kind)
        if kind == "string":
            out[key] = _d(v)
        elif kind == "hash":
            out[key] = {_d(f): _d(x) for f, x in zip(v[::2], v[1::2], strict=True)}
        elif kind == "list":
            out[key] = [_d(x) for x in v]
        elif kind == "set":
            out[key] = {_d(x) for x in v}
        else:
            out[key] = [(_d(m), int(sc)) for m, sc in zip(v[::2], v[1::2], strict=True)]
    return out
