"""The informers' JSON, parsed once per change: node specs and pod infos, kept between passes so a pass
parses only what changed since the last."""

from __future__ import annotations

import logging
from collections.abc import Callable

from fairgpu.errors import RequestError
from fairgpu.k8s.translate import NodeInputs, PodInfo, node_spec, pod_info, refused_gpus
from fairgpu.model import NodeSpec
from fairgpu.model.pod import DEFAULT_RULES, GpuRules

log = logging.getLogger(__name__)


class ParsedNodes:
    def __init__(self, gpus_refused: Callable[[str, str], None] | None = None) -> None:
        self._parsed: dict[str, tuple[NodeInputs, NodeSpec | None]] = {}
        self.gpus_refused = gpus_refused  # (node, why): some of its GPUs are left out of scheduling (MIG mode)

    def read(self, cache: dict[str, dict]) -> list[NodeSpec]:
        """Node specs, parsed again only when what they are read from changed (a bind's node lock changes the
        node, not its GPUs); the same NodeSpec objects come back while nothing changed, so comparing
        inventories stays cheap."""
        specs: list[NodeSpec] = []
        parsed: dict[str, tuple[NodeInputs, NodeSpec | None]] = {}
        for key, obj in sorted(cache.items()):
            inputs = NodeInputs.of(obj)
            hit = self._parsed.get(key)
            if hit is None or hit[0] != inputs:
                try:
                    spec: NodeSpec | None = node_spec(inputs)
                    refused = refused_gpus(inputs)
                    if refused is not None and self.gpus_refused is not None:
                        self.gpus_refused(inputs.name, refused)
                except ValueError as err:
                    log.warning("node %s left out: %s", inputs.name, err)
                    spec = None
                if hit is not None and hit[1] is not None and spec == hit[1]:
                    spec = hit[1]  # unchanged inventory: keep the identical object
                hit = (inputs, spec)
            parsed[key] = hit
            if hit[1] is not None:
                specs.append(hit[1])
        self._parsed = parsed
        return specs


class ParsedPods:
    def __init__(self, rules: GpuRules = DEFAULT_RULES) -> None:
        self.rules = rules  # HAMi's resource names and request defaults
        self.infos: dict[str, PodInfo] = {}
        self.bad: dict[str, str] = {}  # pod key → why it cannot be read
        self.groups: dict[tuple[str, str], set[str]] = {}  # (namespace, pod group) → member keys

    def read(self, cache: dict[str, dict], keys: set[str]) -> None:
        """Bring the parsed view of these pods up to date with the cache: PodInfo, or why it cannot be read."""
        for key in keys:
            old = self.infos.pop(key, None)
            self.bad.pop(key, None)
            if old is not None and old.group:
                self.groups.get((old.namespace, old.group), set()).discard(key)
            obj = cache.get(key)
            if obj is None:
                continue
            try:
                p = pod_info(obj, self.rules)
            except (RequestError, ValueError) as err:
                self.bad[key] = str(err)
                continue
            if p.problem is not None and not p.node:  # not ours to schedule; once bound, it is accounted
                self.bad[key] = p.problem
                continue
            self.infos[key] = p
            if p.group:
                self.groups.setdefault((p.namespace, p.group), set()).add(key)
