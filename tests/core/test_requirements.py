"""Requirements matched to sites (gbroker.core.requirements), and the owner broker that leaves the
sites failing them out of S(i) for every algorithm, says why, and explains each candidate."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gbroker.core.dispatch import (
    Algorithm,
    Broker,
    Dispatch,
    DispatchPolicy,
    JobSubmitted,
    Tick,
    Withdraw,
)
from gbroker.core.model import Job, Observation, SiteState
from gbroker.core.ranking import Candidate, f_terms, rank_sites
from gbroker.core.requirements import (
    FileSystemNeed,
    FileSystemSpec,
    Need,
    Requirements,
    SiteProperties,
    candidate_hosts_at,
    closest_unmet,
    format_bytes,
    known_names,
    unmet,
)
from gbroker.errors import InvalidInput

GiB = 1 << 30
MiB = 1 << 20


def test_a_site_with_everything_meets_a_demanding_job() -> None:
    props = SiteProperties(
        cores=16,
        operating_system="LINUX",
        operating_system_version="6.1",
        cpu_architecture="x86_64",
        nodes=4,
        memory_per_node=8 * GiB,
        disk=100 * GiB,
        cpu_speed=2.4e9,
        network_bandwidth=1e9,
        exclusive=True,
        file_systems=(FileSystemSpec("SCRATCH", "/scratch", "temporary", 50 * GiB),),
    )
    req = Requirements(
        operating_system="linux",  # compared case-insensitively
        operating_system_version="6.1",
        cpu_architecture="X86_64",
        exclusive_execution=True,
        cpu_speed=2e9,
        network_bandwidth=1e8,
        cores_per_node=4,
        nodes=2,
        individual_memory=8 * GiB,
        total_memory=16 * GiB,  # 8 cores span 2 nodes of 8 GiB
        individual_disk=10 * GiB,
        total_disk=200 * GiB,
        file_systems=(FileSystemNeed("SCRATCH", "temporary", "/scratch", 10 * GiB),),
    )
    assert props.cores_per_node == 4  # from nodes
    assert unmet(req, "a", props, rank=8) == []


def test_each_requirement_fails_with_the_sites_value() -> None:
    props = SiteProperties(
        cores=8,
        operating_system="LINUX",
        cpu_architecture="x86_64",
        memory_per_core=1 * GiB,
        file_systems=(FileSystemSpec("HOME", "/home", free=GiB),),
    )
    req = Requirements(
        operating_system="WINNT",
        operating_system_version="10",
        cpu_architecture="sparc",
        exclusive_execution=True,
        cpu_speed=1e9,
        nodes=2,
        individual_memory=16 * GiB,
        total_memory=16 * GiB,
        file_systems=(FileSystemNeed("SCRATCH"), FileSystemNeed("HOME", disk=2 * GiB)),
    )
    failures = {u.need: u for u in unmet(req, "a", props, rank=4)}
    assert set(failures) == {
        Need.OPERATING_SYSTEM,
        Need.OPERATING_SYSTEM_VERSION,
        Need.CPU_ARCHITECTURE,
        Need.EXCLUSIVE_EXECUTION,
        Need.CPU_SPEED,
        Need.NODES,
        Need.INDIVIDUAL_MEMORY,
        Need.TOTAL_MEMORY,
        Need.FILE_SYSTEM,
    }
    assert failures[Need.OPERATING_SYSTEM].has == "LINUX"
    assert failures[Need.CPU_SPEED].has == "no declared CPU speed"
    # One node of 8 cores at 1 GiB per core; 4 cores get 4 GiB.
    assert failures[Need.INDIVIDUAL_MEMORY].has == "8 GiB memory per node"
    assert failures[Need.TOTAL_MEMORY].has == "4 GiB memory for 4 cores"
    assert str(failures[Need.NODES]) == (
        "total_resource_count: the job needs >= 2 nodes; site a has 1 nodes"
    )
    # Both file-system failures are reported, the missing one first.
    fs = [u for u in unmet(req, "a", props, rank=4) if u.need is Need.FILE_SYSTEM]
    assert [u.has for u in fs] == ["file systems: HOME", "1 GiB free"]


def test_undeclared_properties_cannot_be_promised_but_nodes_default_to_one() -> None:
    bare = SiteProperties(cores=32)
    assert unmet(Requirements(cores_per_node=32), "a", bare) == []
    assert [u.need for u in unmet(Requirements(individual_memory=1), "a", bare)] == [
        Need.INDIVIDUAL_MEMORY
    ]
    assert unmet(None, "a", bare, rank=64)[0].need is Need.CORES


def test_x86_and_x86_32_are_one_architecture() -> None:
    props = SiteProperties(cpu_architecture="x86_32")
    assert unmet(Requirements(cpu_architecture="x86"), "a", props) == []


def test_candidate_hosts_name_the_sites_a_job_may_run_at_by_pattern() -> None:
    """JSDL's CandidateHosts, which were read and never matched: a site is a candidate when its
    name matches one of them (shell patterns, without regard to case)."""
    hosts = Requirements(candidate_hosts=("r?c1", "*.example.org"))
    props = SiteProperties(cores=4)
    assert unmet(hosts, "r0c1", props) == []
    assert unmet(hosts, "R1C1", props) == []
    assert unmet(hosts, "gpu.example.org", props) == []
    [failure] = unmet(hosts, "r0c0", props)
    assert (failure.need, failure.wanted, failure.has) == (
        Need.CANDIDATE_HOSTS,
        "the name r?c1 or *.example.org",
        "the name r0c0",
    )
    sites = {"r0c0": props, "r1c1": props}
    assert closest_unmet(hosts, 1, sites) is None
    assert closest_unmet(hosts, 1, {"r0c0": props}) == failure
    with pytest.raises(InvalidInput, match="candidate_hosts"):
        Requirements(candidate_hosts=("",))


CLUSTER = SiteProperties(cores=8, hosts=("x01", "x02", "x03", "x04"))  # 4 nodes of 2 cores


@pytest.mark.parametrize(
    ("patterns", "site", "hosts"),
    [
        (("Xeon80",), "Xeon80", ("x01", "x02", "x03", "x04")),  # the site: every host
        (("xeon*",), "Xeon80", ("x01", "x02", "x03", "x04")),  # a pattern, in any case
        (("X03",), "Xeon80", ("x03",)),  # a host of the site
        (("x0[24]",), "Xeon80", ("x02", "x04")),
        (("Xeon80/x01", "xeon*/X04"), "Xeon80", ("x01", "x04")),  # SITE/HOST
        (("Xeon80/x01", "Xeon80"), "Xeon80", ("x01", "x02", "x03", "x04")),  # the site wins
        (("Other/x01",), "Xeon80", None),  # a host of another site
        (("Xeon80/z*",), "Xeon80", None),  # no such host there
        (("x05",), "Xeon80", None),
    ],
)
def test_candidate_hosts_name_sites_or_hosts_of_sites(
    patterns: tuple[str, ...], site: str, hosts: tuple[str, ...] | None
) -> None:
    assert candidate_hosts_at(patterns, site, CLUSTER) == hosts


def test_a_site_without_declared_hosts_is_one_host_named_as_the_site() -> None:
    props = SiteProperties(cores=8, nodes=4)  # nodes, but no names for them
    assert props.host_names("P4-18") == ("P4-18",)
    assert candidate_hosts_at(("p4-18",), "P4-18", props) == ("P4-18",)
    assert candidate_hosts_at(("P4-18/P4-18",), "P4-18", props) == ("P4-18",)
    assert candidate_hosts_at(("P4-18/n1",), "P4-18", props) is None
    # Held to its one host, a job may still use every core of the site.
    assert unmet(Requirements(candidate_hosts=("P4-18/*",)), "P4-18", props, rank=8) == []


def test_a_job_held_to_some_hosts_of_a_site_must_fit_on_them() -> None:
    two = Requirements(candidate_hosts=("x01", "x02"))
    assert unmet(two, "a", CLUSTER, rank=4) == []
    [failure] = unmet(two, "a", CLUSTER, rank=5)
    assert (failure.need, failure.wanted, failure.has) == (
        Need.CANDIDATE_HOSTS,
        "5 cores",
        "4 cores on its hosts x01, x02",
    )
    [failure] = unmet(Requirements(candidate_hosts=("x01",), nodes=2), "a", CLUSTER, rank=1)
    assert failure.wanted == "1 core on 2 nodes"
    [failure] = unmet(Requirements(candidate_hosts=("y*",)), "a", CLUSTER)
    assert failure.has == "the name a and hosts x01, x02, x03, x04"


def test_site_hosts_are_one_name_per_node() -> None:
    assert SiteProperties(cores=8, hosts=("a", "b")).cores_per_node == 4  # hosts give nodes
    assert SiteProperties(cores=8, cores_per_node=4, hosts=("a", "b")).nodes == 2
    for kwargs, found in [
        ({"cores": 8, "nodes": 4, "hosts": ("a", "b")}, 2),  # not one per node
        ({"cores": 8, "hosts": ("a", "b", "c")}, 3),  # 3 nodes do not divide 8 cores
        ({"cores": 2, "hosts": ("a", "A")}, "A"),  # a host twice (names have no case)
        ({"cores": 2, "hosts": ("s/a", "b")}, "s/a"),  # '/' splits SITE/HOST
        ({"cores": 2, "hosts": ("a*", "b")}, "a*"),  # a name, not a pattern
    ]:
        with pytest.raises(InvalidInput) as caught:
            SiteProperties(**kwargs)  # type: ignore[arg-type]
        assert caught.value.field in ("hosts", "nodes"), caught.value
        assert caught.value.found == found


def test_known_names_list_sites_and_their_hosts_bounded() -> None:
    sites = {"Xeon80": CLUSTER, "P4-18": SiteProperties(cores=18)}
    assert known_names(sites) == "Xeon80, Xeon80/x01, Xeon80/x02, Xeon80/x03, Xeon80/x04, P4-18"
    assert known_names(sites, most=2) == "Xeon80, Xeon80/x01 and 4 more"


def test_total_memory_per_node_counts_the_nodes_a_job_spans() -> None:
    props = SiteProperties(cores=8, nodes=4, memory_per_node=2 * GiB)  # 2 cores per node
    need = Requirements(total_memory=5 * GiB)
    assert [u.has for u in unmet(need, "a", props, rank=4)] == ["4 GiB memory for 4 cores"]
    assert unmet(need, "a", props, rank=5) == []  # 3 nodes


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"cores": 8, "nodes": 3}, "nodes"),
        ({"cores": 8, "cores_per_node": 3}, "cores_per_node"),
        ({"cores": 8, "nodes": 2, "cores_per_node": 2}, "nodes"),
        ({"memory_per_node": -1}, "memory_per_node"),
        ({"cpu_speed": float("nan")}, "cpu_speed"),
        ({"exclusive": "yes"}, "exclusive"),
        (
            {"file_systems": (FileSystemSpec("A", "/a"), FileSystemSpec("A", "/b"))},
            "file_systems",
        ),
    ],
)
def test_bad_site_properties_name_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        SiteProperties(**kwargs)  # type: ignore[arg-type]
    assert caught.value.field == field


def test_file_system_specs_are_checked() -> None:
    with pytest.raises(InvalidInput, match="absolute path"):
        FileSystemSpec("A", "relative")
    with pytest.raises(InvalidInput, match="normal, spool, temporary, swap"):
        FileSystemSpec("A", "/a", "ramdisk")


def test_closest_unmet_names_the_closest_sites_first_failure() -> None:
    sites = {
        "small": SiteProperties(cores=4, memory_per_node=256 * MiB),
        "big": SiteProperties(cores=64, memory_per_node=512 * MiB),
    }
    need = Requirements(individual_memory=800 * MiB)
    closest = closest_unmet(need, 8, sites)
    assert closest is not None
    assert (closest.site, closest.need, closest.has) == (
        "big",
        Need.INDIVIDUAL_MEMORY,
        "512 MiB memory per node",
    )
    assert closest_unmet(need, 8, {**sites, "fat": SiteProperties(16, memory_per_node=GiB)}) is None
    with pytest.raises(InvalidInput):
        closest_unmet(need, 1, {})


def test_format_bytes_reads_well() -> None:
    assert [format_bytes(x) for x in (100, 1536, 800 * MiB, 1.5 * GiB, 3 << 40)] == [
        "100 bytes",
        "1.5 KiB",
        "800 MiB",
        "1.5 GiB",
        "3 TiB",
    ]


# -- F(j) term by term ---------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    rank=st.integers(1, 8),
    sites=st.lists(
        st.tuples(
            st.integers(1, 16),
            st.integers(0, 16),
            st.integers(0, 5),
            st.floats(0, 100, allow_nan=False),
            st.booleans(),
        ),
        min_size=1,
        max_size=8,
    ),
)
def test_f_terms_add_up_to_the_rankings_f(
    rank: int, sites: list[tuple[int, int, int, float, bool]]
) -> None:
    candidates = [
        Candidate(f"s{k}", SiteState(n, min(c, n), q, draining=d), t)
        for k, (n, c, q, t, d) in enumerate(sites)
    ]
    terms = f_terms(rank, candidates)
    scores = rank_sites(rank, candidates)
    assert [t.site for t in terms] == [s.site for s in scores]
    for term, score in zip(terms, scores, strict=True):
        assert term.value == score.value  # the same arithmetic, exactly
        assert term.waits == score.waits
        expected = term.transfer + (term.free + term.load if term.waits else 0.0)
        assert term.value == pytest.approx(expected)
        if not term.waits:
            assert term.free == term.load == 0.0


# -- the owner broker ------------------------------------------------------------------------

PROPS = {
    "a": SiteProperties(cores=8, memory_per_node=512 * MiB, operating_system="LINUX"),
    "b": SiteProperties(cores=8, memory_per_node=4 * GiB, operating_system="LINUX"),
    "c": SiteProperties(cores=8, memory_per_node=256 * MiB, operating_system="LINUX"),
}
BIG_MEMORY = Requirements(individual_memory=800 * MiB)


def no_transfer(src: str, dst: str, size: int) -> float:
    return 0.0


def owner(algorithm: str = "dlo", props: dict[str, SiteProperties] | None = None) -> Broker:
    policy = DispatchPolicy(Algorithm(algorithm))
    return Broker("a", ["b", "c"], policy, no_transfer, random.Random(1), properties=props or PROPS)


def view(**sites: tuple[int, int, int]) -> dict[str, Observation]:
    return {n: Observation(SiteState(t, c, q), 0.0) for n, (t, c, q) in sites.items()}


IDLE = view(a=(8, 8, 0), b=(8, 8, 0), c=(8, 8, 0))


@pytest.mark.parametrize(
    "algorithm", ["dlo", "dr", "dm", "drm", "random", "roundrobin", "worstfit", "closetofiles"]
)
def test_every_algorithm_keeps_a_memory_hungry_job_off_sites_without_the_memory(
    algorithm: str,
) -> None:
    b = owner(algorithm)
    for k in range(20):
        job = Job(f"j{k}", 1, requirements=BIG_MEMORY)
        for command in b.handle(JobSubmitted(job), 1.0, IDLE):
            assert isinstance(command, Dispatch)
            assert command.site == "b"


def test_central_matches_requirements_too() -> None:
    b = Broker("a", ["b", "c"], DispatchPolicy(Algorithm.CENTRAL), no_transfer, properties=PROPS)
    [command] = b.handle(JobSubmitted(Job("j", 1, requirements=BIG_MEMORY)), 1.0, IDLE)
    assert isinstance(command, Dispatch)
    assert command.site == "b"


def test_migration_never_moves_a_job_to_a_site_without_what_it_needs() -> None:
    b = Broker(
        "a", ["b", "c"], DispatchPolicy(Algorithm.DM, epsilon=0.0), no_transfer, properties=PROPS
    )
    job = Job("j", 4, requirements=BIG_MEMORY)
    busy_b = view(a=(8, 8, 0), b=(8, 0, 5), c=(8, 8, 0))
    [dispatch] = b.handle(JobSubmitted(job), 1.0, busy_b)
    assert isinstance(dispatch, Dispatch)
    assert dispatch.site == "b"
    from gbroker.core.dispatch import JobQueued

    b.handle(JobQueued("j", "b"), 2.0, busy_b)
    # a and c are idle and F would favour them, but neither has the memory.
    assert [c for c in b.handle(Tick(), 3.0, busy_b) if isinstance(c, Withdraw)] == []


def test_a_job_no_neighbour_fits_is_refused_naming_the_requirement_and_the_closest_value() -> None:
    b = owner()
    job = Job("j", 2, requirements=Requirements(individual_memory=8 * GiB))
    with pytest.raises(InvalidInput) as caught:
        b.handle(JobSubmitted(job), 1.0, IDLE)
    err = caught.value
    assert err.field == "job[j].individual_physical_memory"
    assert err.expected == "a site of the neighbourhood of a with >= 8 GiB memory per node"
    assert err.found == "4 GiB memory per node at site b, the closest of 3"
    assert "j" not in b.jobs


def test_requirements_are_matched_once_per_distinct_set() -> None:
    b = owner()
    for k in range(5):
        b.handle(JobSubmitted(Job(f"j{k}", 1, requirements=BIG_MEMORY)), 1.0, IDLE)
    assert list(b._fits) == [(BIG_MEMORY, 1)]


def test_a_broker_without_properties_matches_nothing_but_cores() -> None:
    b = Broker("a", ["b", "c"], DispatchPolicy(), no_transfer)
    [command] = b.handle(JobSubmitted(Job("j", 1, requirements=BIG_MEMORY)), 1.0, IDLE)
    assert isinstance(command, Dispatch)


PINNED = Requirements(candidate_hosts=("c",))


@pytest.mark.parametrize(
    "algorithm", ["dlo", "dr", "dm", "drm", "random", "roundrobin", "worstfit", "closetofiles"]
)
@pytest.mark.parametrize("props", [PROPS, None], ids=["properties", "no-properties"])
def test_every_algorithm_keeps_a_pinned_job_at_its_candidate_hosts(
    algorithm: str, props: dict[str, SiteProperties] | None
) -> None:
    """A job pinned to site c goes only there, 20 of 20, whether or not the broker knows the
    sites' properties (without them it used to match nothing, candidate hosts included)."""
    b = Broker("a", ["b", "c"], DispatchPolicy(Algorithm(algorithm)), no_transfer,
               random.Random(1), properties=props)  # fmt: skip
    sites = []
    for k in range(20):
        for command in b.handle(JobSubmitted(Job(f"j{k}", 1, requirements=PINNED)), 1.0, IDLE):
            assert isinstance(command, Dispatch)
            sites.append(command.site)
    assert len(sites) >= 20
    assert set(sites) == {"c"}


def test_a_job_pinned_to_a_host_goes_to_the_site_of_that_host() -> None:
    props = {
        "a": SiteProperties(cores=8),
        "b": SiteProperties(cores=8, hosts=("b1", "b2")),
        "c": SiteProperties(cores=8, hosts=("c1", "c2")),
    }
    b = Broker("a", ["b", "c"], DispatchPolicy(), no_transfer, properties=props)
    for k, hosts in enumerate([("C2",), ("c/c1",), ("*2", "b/nothing")]):
        job = Job(f"j{k}", 2, requirements=Requirements(candidate_hosts=hosts))
        [command] = b.handle(JobSubmitted(job), 1.0, IDLE)
        assert isinstance(command, Dispatch)
        expected = "b" if k == 2 else "c"  # *2 names b2 and c2: b ranks first on a tie
        assert command.site == expected, hosts
    # explain says which hosts of the chosen site the job is held to (none: any of them).
    verdicts = b.explain(Job("x", 2, requirements=Requirements(candidate_hosts=("c/c1",))), IDLE, 1)
    assert [(v.site, v.hosts) for v in verdicts if v.feasible] == [("c", ("c1",))]
    whole = b.explain(Job("y", 2, requirements=Requirements(candidate_hosts=("c",))), IDLE, 1)
    assert [(v.site, v.hosts) for v in whole if v.feasible] == [("c", ())]


def test_a_job_no_neighbour_is_named_by_is_refused_with_the_names_the_broker_knows() -> None:
    props = {**PROPS, "c": SiteProperties(cores=8, hosts=("c1", "c2"))}
    b = Broker("a", ["b", "c"], DispatchPolicy(), no_transfer, properties=props)
    job = Job("j", 1, requirements=Requirements(candidate_hosts=("node7.example.org",)))
    with pytest.raises(InvalidInput) as caught:
        b.handle(JobSubmitted(job), 1.0, IDLE)
    err = caught.value
    assert err.field == "job[j].candidate_hosts"
    assert err.expected == (
        "a site of the neighbourhood of a with the name node7.example.org "
        "(names it knows: a, b, c, c/c1, c/c2)"
    )
    assert err.found == "the name a at site a, the closest of 3"


def test_explain_says_which_sites_candidate_hosts_leave_out() -> None:
    b = owner()
    verdicts = {v.site: v for v in b.explain(Job("j", 1, requirements=PINNED), IDLE, 1.0)}
    assert verdicts["c"].feasible
    for site in ("a", "b"):
        assert verdicts[site].reason == (
            f"candidate_hosts: the job needs the name c; site {site} has the name {site}"
        )
    bare = Broker("a", ["b", "c"], DispatchPolicy(), no_transfer)  # no properties
    verdicts = {v.site: v for v in bare.explain(Job("j", 1, requirements=PINNED), IDLE, 1.0)}
    assert [s for s, v in verdicts.items() if v.feasible] == ["c"]
    assert verdicts["b"].unmet is not None
    assert verdicts["b"].unmet.need is Need.CANDIDATE_HOSTS


def test_explain_lists_each_candidate_with_its_terms_or_why_not() -> None:
    props = {
        **PROPS,
        "d": SiteProperties(cores=2, memory_per_node=GiB),
        "e": SiteProperties(cores=8, memory_per_node=GiB),
    }
    b = Broker("a", ["b", "c", "d", "e", "f"], DispatchPolicy(), no_transfer, properties=props)
    v = {
        **view(a=(8, 8, 0), b=(8, 2, 1), c=(8, 8, 0), d=(2, 2, 0)),
        "e": Observation(SiteState(8, 8, 0, draining=True), 0.0),
    }
    job = Job("j", 4, requirements=BIG_MEMORY)
    verdicts = {v.site: v for v in b.explain(job, v, 1.0)}
    assert [v.site for v in b.explain(job, v, 1.0)][:1] == ["b"]  # feasible first
    best = verdicts["b"]
    assert best.best
    assert best.feasible
    terms = best.terms
    assert terms is not None
    assert terms.waits  # 2 free of 4 needed, and a queue
    assert terms.value == pytest.approx(terms.transfer + terms.free + terms.load)
    why = verdicts["a"].unmet
    assert why is not None
    assert why.need is Need.INDIVIDUAL_MEMORY
    assert "512 MiB memory per node" in verdicts["a"].reason
    assert verdicts["d"].reason == "too small: 2 cores"
    assert verdicts["e"].reason == "draining: it takes no new work"
    assert verdicts["f"].reason == "no state known yet"
    assert not any(v.feasible for s, v in verdicts.items() if s != "b")
    # Explaining changes nothing: the job was never submitted, no round-robin turn taken.
    assert b.jobs == {}
