"""k8s/writes.py on its own: which failures may still land (no answer, any 5xx; a 4xx is a refusal), and that
Writes.send counts such a write as given up unanswered, which keeps the lease from release for a lease
duration (the live test is test_live_flaky.py::test_a_write_answered_with_a_5xx_may_still_land...)."""

from __future__ import annotations

import asyncio

import pytest

from fairgpu.errors import KubeError
from fairgpu.k8s.writes import Writes, may_have_landed


@pytest.mark.parametrize(
    ("code", "landed"), [(0, True), (500, True), (504, True), (409, False), (499, False), (1, False)]
)
def test_no_answer_and_every_5xx_may_have_landed_and_a_4xx_did_not(code, landed):
    """Catches `or` -> `and`, `== 0` -> `!= 0` or `== 1`, `>= 500` -> `> 500` or `>= 1000`."""
    assert may_have_landed(KubeError(code, "", "")) is landed


def test_a_write_answered_5xx_is_given_up_unanswered_and_one_answered_4xx_is_not():
    """A 503 sets unanswered_at (not quiet for a lease duration); a 409 leaves the writes quiet. Catches
    `answered = not may_have_landed(err)` with the `not` dropped."""

    async def failing(code: int) -> None:
        raise KubeError(code, "", "")

    for code, quiet in ((409, True), (503, False)):
        writes = Writes()
        with pytest.raises(KubeError):
            asyncio.run(writes.send(lambda: None, failing, code))
        assert writes.sending == 0 and writes.quiet(15.0) is quiet
