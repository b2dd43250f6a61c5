"""Every exception fairgpu raises, under one base class.

    FairgpuError                  anything fairgpu raises on purpose
    ├── InputError (ValueError)   bad input from a user or the cluster; the message names the field
    │   ├── QuantityError         not a Kubernetes quantity ("12Gx")
    │   ├── RequestError          a pod request that can never be placed (`field` names the resource)
    │   ├── ScenarioError         a scenario, trace or queue document that does not validate
    │   ├── ProfileError          a profile naming an unknown plugin, a wrong point or bad arguments
    │   ├── FormatError           an annotation value not in HAMi's format (names the annotation)
    │   └── HamiConfigError       a HAMi config file (--hami-config, a scenario's `hami:`) that does not read
    ├── StateError (RuntimeError) an assign/release that would corrupt ClusterState; nothing changed
    ├── ElectorDied (RuntimeError) the lease's elector process kept dying (k8s/elector_process.py)
    └── ClusterError              talking to the cluster failed
        ├── KubeError             the API server answered an error (`code` 0: it did not answer)
        └── BindError             a pod was not bound; its reservation must be rolled back
            └── FenceClosed       not leading (or stopping): a write carrying out a decision was not sent

Boundaries translate foreign exceptions into these: pydantic's ValidationError into ScenarioError (or
the field-naming message of `spec.validation_message`), aiohttp's and kubernetes-asyncio's into KubeError.
The CLI turns any InputError into one line on stderr and exit status 2.
"""

from __future__ import annotations


class FairgpuError(Exception):
    """Base of every exception fairgpu raises on purpose."""


class InputError(FairgpuError, ValueError):
    """Bad input; the message is one line naming the field and the problem."""


class QuantityError(InputError):
    """A value that is not a Kubernetes quantity."""


class RequestError(InputError):
    """A pod's resource request that can never be placed; `field` names the resource when one is at fault."""

    def __init__(self, problem: str, field: str | None = None) -> None:
        super().__init__(f"{field}: {problem}" if field else problem)
        self.field = field
        self.problem = problem


class ScenarioError(InputError):
    """Bad scenario (or trace, or queue) input; the message is one line naming the field and the problem."""


class ProfileError(InputError):
    """A profile that names an unknown plugin, a plugin at the wrong point, or bad arguments."""


class FormatError(InputError):
    """An annotation value that is not in HAMi's format; the message names the annotation."""


class HamiConfigError(InputError):
    """A HAMi device config fairgpu cannot read; the message names the file and key."""


class StateError(FairgpuError, RuntimeError):
    """An assign/release that would corrupt the state; nothing was changed."""


class ElectorDied(FairgpuError, RuntimeError):
    """The leader elector's process died again and again: the scheduler stops rather than run unelected."""


class ClusterError(FairgpuError):
    """Talking to the cluster failed."""


class KubeError(ClusterError):
    """The API server answered with an error status; code 0 when it did not answer at all."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(f"{code} {reason}: {message}")
        self.code = code
        self.reason = reason
        self.message = message


class BindError(ClusterError):
    """The pod was not bound; the reservation must be rolled back."""


class FenceClosed(BindError):
    """This replica does not lead with margin, or is stopping: a write that carries out a decision (a Binding,
    an Eviction, an annotation, a node lock) was not sent (k8s/writes.py)."""
