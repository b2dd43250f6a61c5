"""The Binding's settle loop (Binder._binding) on a clock of the test's own, so a minute of retries takes no
time: a failure that may have landed (no answer, a 5xx) is sent again, backing off from 0.1 s to at most 2 s,
until the API server's request timeout (60 s) has passed; a refusal is final at once; 409 "already assigned"
to this node is an earlier attempt that landed (the live tests are test_live_binds.py, test_live_flaky.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from fairgpu.errors import BindError, KubeError
from fairgpu.k8s.binder import Binder

POD = SimpleNamespace(namespace="a", name="p", uid="u-1")


class Port:
    """The API server's answers to the Binding, one per attempt (the last repeats); when each was sent."""

    def __init__(self, now: list[float], *answers: KubeError | None) -> None:
        self.now, self.answers, self.sent = now, list(answers), []

    async def bind(self, ns: str, name: str, uid: str, node: str, annotations: dict[str, str]) -> None:
        self.sent.append(self.now[0])
        if len(self.sent) > 100:
            raise RuntimeError("sent again without end")  # bounded: a loop that never settles fails here
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if answer is not None:
            raise answer


def attempts(monkeypatch, *answers: KubeError | None, **binder) -> tuple[list[float], BaseException | None]:
    """When each Binding was sent (s after the first), and what `_binding` raised."""
    now = [0.0]

    async def sleep(seconds: float) -> None:
        now[0] += seconds

    monkeypatch.setattr(asyncio, "sleep", sleep)
    port = Port(now, *answers)

    async def go() -> BaseException | None:
        asyncio.get_running_loop().time = lambda: now[0]  # type: ignore[method-assign]
        try:
            await Binder(port, **binder)._binding(POD, "node-01", {})
        except BindError as err:
            return err
        return None

    return port.sent, asyncio.run(go())


def test_a_binding_that_may_have_landed_is_sent_again_backing_off_to_two_seconds_for_the_request_timeout(monkeypatch):
    """504 every time: sent at 0, 0.1, 0.3, 0.7, 1.5, 3.1, then every 2 s up to 59.1 (one more would go out
    past 60 s, when no earlier attempt can still be carried out), then a failure. Catches the backoff's start,
    factor or cap changed, the settle window counted backwards, and BINDING_SETTLE other than the API server's
    default --request-timeout."""
    sent, err = attempts(monkeypatch, KubeError(504, "Timeout", "the request timed out"))
    want = [0.0, 0.1, 0.3, 0.7, 1.5, *(3.1 + 2 * k for k in range(29))]
    assert sent == pytest.approx(want) and want[-1] == pytest.approx(59.1)
    assert isinstance(err, BindError) and "timed out" in str(err)


def test_a_refusal_is_final_at_once_and_no_answer_then_already_assigned_here_is_a_landed_binding(monkeypatch):
    """422 is a refusal: one Binding, then a failure. No answer (0), then 409 "already assigned" to node-01:
    the first landed, success after two. 409 to another node: a failure at once. Catches `not may_have_landed`
    dropped (a refusal sent again for a minute, a 5xx taken for a refusal) and the 409 test loosened."""
    sent, err = attempts(monkeypatch, KubeError(422, "Invalid", "no such node"))
    assert sent == [0.0] and isinstance(err, BindError)
    landed = KubeError(409, "Conflict", 'pod a/p is already assigned to node "node-01"')
    sent, err = attempts(monkeypatch, KubeError(0, "", "connection reset"), landed)
    assert sent == pytest.approx([0.0, 0.1]) and err is None
    sent, err = attempts(monkeypatch, KubeError(409, "Conflict", 'pod a/p is already assigned to node "node-02"'))
    assert sent == [0.0] and isinstance(err, BindError)
