"""A simulated cluster the dashboard can move through in time: the Source behind `simulate --serve`."""

from __future__ import annotations

import threading

from fairgpu.framework.profile import Profile
from fairgpu.framework.scheduler import CycleResult, Scheduler
from fairgpu.observe.history import QueueHistory
from fairgpu.observe.metrics import SchedulingMetrics
from fairgpu.sim.runner import Simulation
from fairgpu.sim.scenario import Scenario


class Replay:
    """Runs the simulation forward to whatever time is asked; going back replays from the start (the
    engine cannot undo), which the demo scenarios do in seconds."""

    def __init__(self, scenario: Scenario, profile: Profile, metrics: SchedulingMetrics, horizon: float | None = None):
        self.scenario = scenario
        self.profile_spec = profile
        self.metrics = metrics
        self.lock = threading.RLock()
        self.name = scenario.name
        self.profile = profile.name
        self._horizon = scenario.horizon if horizon is None else horizon
        self._start()

    def _start(self) -> None:
        self.sim = Simulation(self.scenario, self.profile_spec, horizon=self._horizon)
        self.sim.observer = self
        self.history = QueueHistory()
        self._now = 0.0
        self.sim.run_until(0.0)

    def on_cycle(self, sched: Scheduler, result: CycleResult, now: float, seconds: float) -> None:
        self.metrics.on_cycle(sched, result, now, seconds)
        self.history.sample(now, sched)

    @property
    def sched(self) -> Scheduler:
        return self.sim.sched

    @property
    def now(self) -> float:
        return self._now

    @property
    def horizon(self) -> float:
        return self._horizon

    def seek(self, t: float) -> None:
        t = min(max(0.0, t), self._horizon)
        with self.lock:
            if t < self._now:
                self._start()
            self.sim.run_until(t)
            self._now = t

    def is_leader(self) -> bool:
        return True  # a replay has no rival replicas

    def ready(self) -> bool:
        return True
