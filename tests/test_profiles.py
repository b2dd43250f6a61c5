"""Profiles: the shipped ones load, bad ones are refused with a message, every extension point is called."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import gpu_node, job, tree, whole
from fairgpu.catalog import builtin_profiles, load_profile, profile_from_dict, registered
from fairgpu.errors import ProfileError
from fairgpu.framework.interfaces import Admit, Filter, Permit, Preempt, QueueSort, Score
from fairgpu.framework.scheduler import Scheduler


def test_builtin_profiles_load_with_their_plugins():
    assert builtin_profiles() == ["fairgpu", "fairgpu-reclaim", "kube-default"]
    kd, fg = load_profile("kube-default"), load_profile("fairgpu")
    assert type(kd.queue_sort).__name__ == "PrioritySort" and not kd.permit and not kd.admit
    assert type(fg.queue_sort).__name__ == "FairShare"
    assert [type(p).__name__ for p in fg.permit] == ["Gang"]
    assert [type(p).__name__ for p in fg.admit] == ["Quota"]


def test_registry_knows_each_plugin_at_its_point():
    reg = registered()
    assert reg["PrioritySort"] == reg["FairShare"] == "QueueSort"
    assert reg["Resources"] == reg["GpuType"] == "Filter"
    assert reg["LeastAllocated"] == reg["Binpack"] == "Score"
    assert reg["Gang"] == "Permit" and reg["Quota"] == "Admit"


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"name": "x", "queueSort": "Nope"}, "queueSort: unknown plugin 'Nope'"),
        ({"name": "x", "queueSort": "Binpack"}, "Binpack is a Score plugin, not QueueSort"),
        ({"name": "x", "queueSort": "FairShare", "filter": ["Gang"]}, "filter[0]: Gang is a Permit plugin"),
        ({"name": "x", "queueSort": "FairShare", "bogus": 1}, "profile bogus"),
        ({"queueSort": "FairShare"}, "profile name"),
        (
            {
                "name": "x",
                "queueSort": "FairShare",
                "score": [{"name": "LeastAllocated", "args": {"resources": ["disk"]}}],
            },
            "score[0]: LeastAllocated args",
        ),
        (
            {"name": "x", "queueSort": "FairShare", "score": [{"name": "Binpack", "weight": -1}]},
            "profile score",
        ),
    ],
)
def test_bad_profiles_are_refused_with_a_message(doc, message):
    with pytest.raises(ProfileError, match=None) as err:
        profile_from_dict(doc)
    assert message in str(err.value)


def test_profile_file_and_unknown_name(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("name: mine\nqueueSort: PrioritySort\nscore: [{name: Binpack, weight: 2}]\n")
    prof = load_profile(str(path))
    assert prof.name == "mine" and prof.score[0][1] == 2.0
    with pytest.raises(ProfileError, match="not a built-in"):
        load_profile("nope")


def test_every_extension_point_is_consulted_in_order():
    calls: list[str] = []

    class Sort:
        within_queue = "fifo"

        def pick(self, active, view):
            calls.append("sort")
            return next(iter(active.queues))

    class Deny:
        def admit(self, workload, queue, charge, view):
            calls.append("admit")
            return "no" if workload.name == "denied" else None

    class OnlyNodeOne:
        NAME = "OnlyNodeOne"

        def filter(self, pod, view, mask):
            calls.append("filter")
            mask.restrict_nodes(np.arange(view.state.num_nodes)[mask.rows] != 0)

    class Flat:
        def generation(self, pod, view):
            return 0

        def score(self, pod, view, mask):
            calls.append("score")
            return view.state.cpu_free[mask.rows] * 0.0

        def gpu_order(self, pod, view, node, slots):
            return slots[::-1]

    class Never:
        def permit(self, workload, placed):
            calls.append("permit")
            return placed == len(workload.pods)

    class Victim:
        def may_find(self, view, queue, charge, least_usage):
            return True

        def preempt(self, ctx):
            calls.append("preempt")
            return np.array([i for i, u in enumerate(ctx.victims.units) if u.workload.name == "ok"])

    from fairgpu.framework.profile import Profile
    from fairgpu.plugins.fit import Resources

    plugins = (Sort(), Deny(), OnlyNodeOne(), Flat(), Never(), Victim())
    for plugin, point in zip(plugins, (QueueSort, Admit, Filter, Score, Permit, Preempt), strict=True):
        assert isinstance(plugin, point)
    prof = Profile(
        "test",
        plugins[0],
        [plugins[1]],
        [plugins[2], Resources()],
        [(plugins[3], 1.0)],
        [plugins[4]],
        [plugins[5]],
        gang=True,
    )
    s = Scheduler([gpu_node("n0", gpus=2), gpu_node("n1", gpus=2)], tree("a"), prof)
    s.submit(job("denied", "a", whole(1, cpu_m=3000), t=0))  # refusals hold per shape
    s.submit(job("ok", "a", whole(1), t=1))
    s.submit(job("toobig", "a", whole(2), pods=2, t=2))
    res = s.cycle(0)
    assert res.started == ["ok"]
    placement = res.bound[0].placement
    assert placement.node == 1 and placement.slots == (1,)  # filter removed n0; gpu_order reversed slots
    assert [e.workload for e in res.evictions] == ["ok"]  # toobig's victim, chosen by the plugin
    # Per attempt, in order: the queue is picked, the workload admitted, nodes filtered and scored; a gang
    # that did not fit whole is offered to Permit, and only then to Preempt (whose dry runs filter again).
    attempts = [
        ["sort", "admit"],  # denied: refused at admission, never filtered
        ["sort", "admit", "filter", "score"],  # ok: placed
        ["sort", "admit", "filter", "permit", "preempt"],  # toobig: no node for its first pod
    ]
    assert calls[:11] == [c for a in attempts for c in a], calls
    assert set(calls[11:]) <= {"filter", "score"}
