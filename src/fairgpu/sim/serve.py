"""`simulate --serve`: replay a scenario into the dashboard until interrupted."""

from __future__ import annotations

import uvicorn
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette

from fairgpu.framework.profile import Profile
from fairgpu.observe.metrics import SchedulingMetrics
from fairgpu.observe.server import create_app
from fairgpu.sim.replay import Replay
from fairgpu.sim.scenario import Scenario


def replay_app(scenario: Scenario, profile: Profile, horizon: float | None = None) -> tuple[Starlette, Replay]:
    registry = CollectorRegistry()  # private: nothing else in the process shows up on /metrics
    source = Replay(scenario, profile, SchedulingMetrics(registry), horizon)
    return create_app(source, registry), source


def serve(scenario: Scenario, profile: Profile, horizon: float | None, host: str, port: int) -> None:
    app, _ = replay_app(scenario, profile, horizon)
    print(f"fairgpu dashboard: http://{host}:{port}/  (replaying {scenario.name} under {profile.name}; Ctrl-C stops)")
    uvicorn.run(app, host=host, port=port, log_level="warning")
