"""HAMi's own configuration, read as HAMi reads it, for both drivers: the `nvidia` section of its device
config (the `hami-scheduler-device` ConfigMap's `device-config.yaml`, keys as in HAMi's NvidiaConfig) and the
node-lock expiry (the chart's `scheduler.nodeLockExpire`, env HAMI_NODELOCK_EXPIRE).

`fairgpu run --hami-config FILE` takes that file (the YAML itself or the ConfigMap manifest); a scenario takes
the same keys under `hami:`. Keys HAMi has and fairgpu does not need (overwriteEnv, migProfileAllowlist, …)
are accepted and ignored, as HAMi's own YAML reader ignores unknown ones.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fairgpu import resources as r
from fairgpu.errors import HamiConfigError
from fairgpu.model.pod import GpuRules

_GO_DURATION = re.compile(r"^(?:(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h))+$")
_GO_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_GO_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def go_duration(value: str) -> timedelta:
    """Go's time.ParseDuration for the positive values a lock expiry takes ("5m", "90s", "1h30m")."""
    text = value.strip()
    if text == "0" or not _GO_DURATION.match(text):
        raise ValueError(f"{value!r} is not a Go duration (e.g. 5m, 90s, 1h30m)")
    return timedelta(seconds=sum(float(n) * _GO_UNIT[u] for n, u in _GO_PART.findall(text)))


class HamiConfig(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)

    resource_count_name: str = Field(r.GPU, alias="resourceCountName", min_length=1)
    resource_memory_name: str = Field(r.GPUMEM, alias="resourceMemoryName", min_length=1)
    resource_memory_percentage_name: str = Field(r.GPUMEM_PCT, alias="resourceMemoryPercentageName", min_length=1)
    resource_core_name: str = Field(r.GPUCORES, alias="resourceCoreName", min_length=1)
    resource_priority_name: str = Field("nvidia.com/priority", alias="resourcePriorityName", min_length=1)
    default_memory: int = Field(0, alias="defaultMemory", ge=0)
    default_cores: int = Field(0, alias="defaultCores", ge=0, le=100)
    default_gpu_num: int = Field(1, alias="defaultGPUNum")
    memory_factor: int = Field(1, alias="memoryFactor")
    # What HAMi's device plugin registers (the simulator plays it; live, the register annotation carries them).
    device_split_count: int = Field(10, alias="deviceSplitCount", ge=1)
    device_memory_scaling: float = Field(1.0, alias="deviceMemoryScaling", gt=0)
    device_core_scaling: float = Field(1.0, alias="deviceCoreScaling", gt=0)
    # What HAMi's webhook injects into the pods it admits (fairgpu's webhook does the same).
    gpu_core_policy: Literal["", "default", "force", "disable"] = Field("", alias="gpuCorePolicy")
    runtime_class_name: str = Field("", alias="runtimeClassName")
    node_lock_expire: str = Field("5m", alias="nodeLockExpire")

    @field_validator("node_lock_expire")
    @classmethod
    def _expiry(cls, v: str) -> str:
        go_duration(v)
        return v

    @property
    def lock_expiry(self) -> timedelta:
        return go_duration(self.node_lock_expire)

    def rules(self) -> GpuRules:
        return GpuRules(
            count_name=self.resource_count_name,
            memory_name=self.resource_memory_name,
            percentage_name=self.resource_memory_percentage_name,
            cores_name=self.resource_core_name,
            default_memory=self.default_memory,
            default_cores=self.default_cores,
            default_gpu_num=self.default_gpu_num,
            memory_factor=self.memory_factor,
        )

    def registered_memory(self, total_mib: int) -> int:
        """A card's `devmem` as HAMi's device plugin registers it: total × deviceMemoryScaling."""
        return int(total_mib * self.device_memory_scaling)

    def registered_cores(self) -> int:
        """A card's `devcore`: 100 × deviceCoreScaling."""
        return int(100 * self.device_core_scaling)


DEFAULT = HamiConfig()


def from_mapping(doc: Any, where: str) -> HamiConfig:
    """The keys of HAMi's `nvidia` section (plus nodeLockExpire) as a HamiConfig; HamiConfigError naming the
    key otherwise."""
    if doc is None:
        return DEFAULT
    if not isinstance(doc, dict):
        raise HamiConfigError(f"{where}: expected a mapping of HAMi's nvidia settings")
    try:
        return HamiConfig.model_validate(doc)
    except ValidationError as err:
        e = err.errors()[0]
        key = ".".join(str(p) for p in e["loc"])
        raise HamiConfigError(f"{where}.{key}: {e['msg']}") from err


def load(path: str | Path) -> HamiConfig:
    """A HAMi device config: the `device-config.yaml` document (its `nvidia:` section is read, and a top-level
    `nodeLockExpire`), or the ConfigMap manifest that carries it under `data`."""
    p = Path(path)
    try:
        doc = yaml.safe_load(p.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise HamiConfigError(f"{p}: {err}") from err
    if isinstance(doc, dict) and doc.get("kind") == "ConfigMap":
        text = (doc.get("data") or {}).get("device-config.yaml")
        if text is None:
            raise HamiConfigError(f"{p}: data.device-config.yaml: missing (HAMi's device ConfigMap carries it)")
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise HamiConfigError(f"{p}: data.device-config.yaml: {err}") from err
    if not isinstance(doc, dict) or not isinstance(doc.get("nvidia"), dict):
        raise HamiConfigError(f"{p}: nvidia: missing (expected HAMi's device config with an nvidia: section)")
    section = dict(doc["nvidia"])
    if "nodeLockExpire" in doc:
        section["nodeLockExpire"] = doc["nodeLockExpire"]
    return from_mapping(section, f"{p}: nvidia")
