"""The client's retries where a server never sees them go wrong: a batch of specs without a
request_id gets one each before the first try (so a retried batch makes no second job), and
a watch of a job quiet for longer than the retry budget still rides out a broken stream."""

from __future__ import annotations

import time
from dataclasses import dataclass

import grpc
import pytest

from shardq.client.base import ClientBase, Watching
from shardq.client.requests import Requests
from shardq.client.retry import Attempts, RetryPolicy
from shardq.v1 import common_pb2


def test_a_batch_spec_without_a_request_id_gets_one_before_the_first_try() -> None:
    named = common_pb2.JobSpec(handler="h", request_id="mine")
    unnamed = common_pb2.JobSpec(handler="h")
    req = Requests("acme").submit_many([named, unnamed])
    first, second = req.jobs
    assert first.request_id == "mine"
    assert len(second.request_id) == 32 and unnamed.request_id == ""  # the caller's untouched
    # The request is built once and sent as it is on every try: the same IDs each time.
    assert Requests("acme").submit_many([unnamed]).jobs[0].request_id != second.request_id


class Broken(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE


@dataclass
class FakeClient:
    """What a Watching asks of its client: the watch request and a fresh retry budget."""

    policy: RetryPolicy
    requests: Requests

    def attempts(self) -> Attempts:
        return Attempts(self.policy)


def test_a_watch_quiet_past_the_budget_still_retries_a_broken_stream() -> None:
    client = FakeClient(RetryPolicy(deadline_s=0.2), Requests("acme"))
    watching = Watching(client, "JOB", timeout=None)  # type: ignore[arg-type]
    watching.seen(common_pb2.Job(job_id="JOB", state=common_pb2.JOB_STATE_READY))
    time.sleep(0.3)  # the job stays READY, no message, longer than the whole budget
    assert watching.pause_after(Broken()) >= 0  # a fresh budget from the failure
    time.sleep(0.3)  # failing on, with no message between: that budget is spent
    with pytest.raises(Broken):
        watching.pause_after(Broken())


def test_a_client_certificate_alone_means_tls() -> None:
    """Given a certificate but not tls=True, the client must not fall back to plaintext
    (where its bearer token would travel in clear)."""
    assert ClientBase("t", client_cert=(b"key", b"chain")).credentials is not None
    assert ClientBase("t").credentials is None
