"""What the trace recorder needs from the cluster beyond the engine: how long each workload's pods really
ran. The engine starts a workload when it decides to bind it; its pods run from when the kubelet starts them
to when they exit, and that is the run length a replay needs (binding takes the cluster time the simulator
does not spend). Measured on the controller's own pod watch, so no second watch is opened."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

from fairgpu.k8s.informer import Informer
from fairgpu.k8s.translate import TERMINAL

MAX_TRACKED = 200_000  # pods whose run is remembered until the recorder asks; beyond, the oldest are dropped


class PodTimes:
    def __init__(self, clock: Callable[[], float], scheduler_name: str) -> None:
        self.clock = clock
        self.scheduler_name = scheduler_name
        self._since: dict[str, tuple[str, float]] = {}  # pod key → (uid, when first seen running)
        self._ran: dict[str, float] = {}  # pod key → seconds it ran, once it stopped

    def attach(self, informer: Informer) -> None:
        """See every pod event before the informer's own handler (the controller), so a workload the
        controller drops for its pods' exit has its run length known by then."""
        handler = informer.handler

        def both(kind: str, obj: dict) -> None:
            self.on_event(kind, obj)
            handler(kind, obj)

        informer.handler = both

    def on_event(self, kind: str, obj: dict) -> None:
        if (obj.get("spec") or {}).get("schedulerName") != self.scheduler_name:
            return
        meta = obj["metadata"]
        key, uid = f"{meta.get('namespace', '')}/{meta['name']}", meta.get("uid", "")
        phase = (obj.get("status") or {}).get("phase")
        if kind == "DELETED" or phase in TERMINAL:
            since = self._since.pop(key, None)
            ran = _terminated(obj) if phase in TERMINAL else None
            if ran is None and since is not None and since[0] == uid:
                ran = self.clock() - since[1]  # no container times: as long as this watch saw it run
            if ran is not None:
                self._ran[key] = ran
                if len(self._ran) > MAX_TRACKED:
                    del self._ran[next(iter(self._ran))]
        elif phase == "Running" and self._since.get(key, ("",))[0] != uid:
            self._since[key] = (uid, self.clock())

    def run_length(self, pods: Sequence[str]) -> float | None:
        """How long the longest of these pods ran (a gang's members start one by one; each runs its work),
        None if none has been seen to run and stop. Forgets them."""
        lengths = [self._ran.pop(k) for k in pods if k in self._ran]
        return max(lengths) if lengths else None


def _terminated(obj: dict) -> float | None:
    """How long the pod's containers ran, as its kubelet reports them (second resolution): from the first
    start to the last finish; None when a container's times are missing."""
    starts, ends = [], []
    for c in (obj.get("status") or {}).get("containerStatuses") or []:
        done = (c.get("state") or {}).get("terminated") or {}
        try:
            starts.append(datetime.fromisoformat(done["startedAt"].replace("Z", "+00:00")).timestamp())
            ends.append(datetime.fromisoformat(done["finishedAt"].replace("Z", "+00:00")).timestamp())
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
    return max(ends) - min(starts) if starts else None
