"""A shard's address: ``host:port`` or a Sentinel group, and the durability flags."""

from __future__ import annotations

import argparse

import pytest

from shardq.common import config
from shardq.common.errors import InvalidArgument, Unavailable
from shardq.common.redis import Durability, NotReplicated, parse_sentinel
from shardq.coordinator.shardmap import _check_address


def test_a_sentinel_address_names_its_sentinels_and_master() -> None:
    got = parse_sentinel("sentinel://s0:26380,s1,[::1]:26381,[fe80::2]/shard-0")
    assert got.sentinels == (("s0", 26380), ("s1", 26379), ("::1", 26381), ("fe80::2", 26379))
    assert got.master == "shard-0"
    assert _check_address("sentinel://s0:26379/shard-0", 0) == "sentinel://s0:26379/shard-0"


@pytest.mark.parametrize(
    ("address", "says"),
    [
        ("sentinel://s0:26379", "names its master after one slash"),
        ("sentinel://s0:26379/", "names its master after one slash"),
        ("sentinel://s0:26379/a/b", "names its master after one slash"),
        ("sentinel:///shard-0", "names no sentinel"),
        ("sentinel://s0:http/shard-0", "is not host:port"),
        ("sentinel://s0:70000/shard-0", "is not host:port"),
        ("sentinel://::1/shard-0", "IPv6 address in brackets"),
        ("sentinel://[::1/shard-0", "is not host:port"),
        ("sentinel://[::1]x/shard-0", "is not host:port"),
        ("sentinel://pw@s0:26379/shard-0", "no user or password"),
    ],
)
def test_a_malformed_sentinel_address_is_refused_naming_the_field(address: str, says: str) -> None:
    with pytest.raises(InvalidArgument, match=says) as caught:
        _check_address(address, 3)
    assert caught.value.field == "addresses[3]"


def test_wait_replies_short_of_the_replicas_asked_are_not_acknowledged() -> None:
    Durability(1).check(1)
    Durability(2).check(3)
    with pytest.raises(NotReplicated, match="0 of 1 replica") as caught:
        Durability(1).check(0)
    assert isinstance(caught.value, Unavailable)
    aof = Durability(1, aof=True)
    assert aof.command() == ("WAITAOF", 1, 1, 1_000)
    aof.check([1, 1])
    with pytest.raises(NotReplicated, match="fsynced by 0 of 1"):
        aof.check([1, 0])
    with pytest.raises(NotReplicated):
        aof.check([0, 1])  # not even in the primary's own AOF


def test_the_durability_flags_and_their_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDQ_SHARD_REPLICAS_TO_ACK", "1")
    monkeypatch.setenv("SHARDQ_SHARD_WAIT_AOF", "yes")
    p = argparse.ArgumentParser()
    config.add_shard_durability(p)
    assert config.durability(p.parse_args([])) == Durability(1, 1_000, aof=True)
    args = p.parse_args(["--shard-replicas-to-ack", "2", "--shard-replica-ack-timeout-ms", "50"])
    assert config.durability(args) == Durability(2, 50, aof=True)
    with pytest.raises(SystemExit):
        config.durability(p.parse_args(["--shard-replicas-to-ack", "-1"]))
    with pytest.raises(SystemExit, match="1 to 5000"):  # past the 10 s socket timeout: no
        config.durability(p.parse_args(["--shard-replica-ack-timeout-ms", "10000"]))
