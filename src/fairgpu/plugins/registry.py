"""The built-in plugins, by name: one explicit mapping (as kube-scheduler's NewInTreeRegistry), each name
taken from the plugin's own NAME constant. Profiles name plugins from here; conformance of each to its
extension point is checked when a profile builds it (framework/profile.py)."""

from __future__ import annotations

from fairgpu.framework.interfaces import Admit, Filter, Permit, Preempt, QueueSort, Score
from fairgpu.framework.profile import Named, PluginEntry, Registry
from fairgpu.plugins.affinity import NodeAffinity
from fairgpu.plugins.baselines import BestFit, DotProd, GpuClustering, GpuPacking, Random
from fairgpu.plugins.fit import Resources
from fairgpu.plugins.fragmentation import Fragmentation
from fairgpu.plugins.gang import Gang
from fairgpu.plugins.gputype import GpuType
from fairgpu.plugins.preemption import Preemption
from fairgpu.plugins.quota import Quota
from fairgpu.plugins.scores import Binpack, LeastAllocated, PodPolicy, Spread
from fairgpu.plugins.sort import FairShare, PrioritySort

_BY_POINT: dict[type, tuple[type[Named], ...]] = {
    QueueSort: (PrioritySort, FairShare),
    Admit: (Quota,),
    Filter: (NodeAffinity, GpuType, Resources),
    Score: (
        LeastAllocated,
        Binpack,
        Spread,
        PodPolicy,
        Fragmentation,
        Random,
        BestFit,
        DotProd,
        GpuPacking,
        GpuClustering,
    ),
    Permit: (Gang,),
    Preempt: (Preemption,),
}

IN_TREE: Registry = {
    plugin.NAME: PluginEntry(point, plugin) for point, plugins in _BY_POINT.items() for plugin in plugins
}
