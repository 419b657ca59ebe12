"""What a broker refuses of a job at submission, decided from its description alone (pure).

Theory of operation. A broker checks a submission before anything is journaled
(:mod:`gbroker.daemon.client_api`); ``gbroker jsdl check`` runs the same checks offline, so
that a file it calls ok is one a broker takes. Both come from here:

* :func:`staging_refusals`: each staging source a broker would never fetch and each target it
  cannot deliver to (:mod:`gbroker.jobs.urls`: the scheme, user info, a private address), and a
  CreationFlag ``append`` on a stage-out (an HTTP ``PUT`` or the store replaces a file; neither
  can append to one).
* :func:`requirement_refusal`: a job no site of the fleet fits (its cores and the requirements
  of its Resources against every site's properties, :func:`~gbroker.core.requirements.
  closest_unmet`), naming the requirement and the closest site's value (and, for candidate
  hosts, the names of sites and hosts the fleet knows).

What needs the network (an input's size learned with ``HEAD``, a source that answers it has no
such file) or the broker's neighbourhood stays with the daemon. Each refusal is an
:class:`~gbroker.errors.InvalidInput` naming the element (JSDL) or field (JSON/YAML).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from gbroker.core.requirements import Need, SiteProperties, closest_unmet, known_names
from gbroker.errors import InvalidInput
from gbroker.jobs.description import CreationFlag, JobDescription
from gbroker.jobs.documents import requirement_field
from gbroker.jobs.jsdl_paths import DESC
from gbroker.jobs.urls import check_source, check_target

__all__ = ["refusals", "requirement_refusal", "staging_field", "staging_refusals"]


def staging_field(index: int, part: str, xml: bool) -> str:
    """How an error names entry ``index`` (from 0) of a description: its element path when the
    user wrote JSDL, else its field (``part``: source, target or creation_flag)."""
    if xml:
        element = {"source": "Source/URI", "target": "Target/URI"}.get(part, "CreationFlag")
        return f"{DESC}/DataStaging[{index + 1}]/{element}"
    return f"staging[{index}].{part}"


def staging_refusals(
    desc: JobDescription, *, xml: bool, allow_private: bool, peers: Mapping[str, str]
) -> Iterator[InvalidInput]:
    """Each staging entry a broker would refuse, in document order (see the module docstring).

    ``allow_private``: the broker takes sources on private addresses (``gbroker serve
    --allow-private-sources``); ``peers``: each topology site's HTTP base (its store's URLs
    are sources of the fleet)."""
    for index, entry in enumerate(desc.staging):
        if entry.source is not None and entry.inline_data is None:
            try:
                check_source(
                    entry.source,
                    allow_private=allow_private,
                    peers=peers,
                    field=staging_field(index, "source", xml),
                )
            except InvalidInput as exc:
                yield exc
        if entry.target is None:
            continue
        try:
            check_target(
                entry.target,
                allow_private=allow_private,
                field=staging_field(index, "target", xml),
            )
        except InvalidInput as exc:
            yield exc
        if entry.creation_flag is CreationFlag.APPEND:
            yield InvalidInput(
                staging_field(index, "creation_flag", xml),
                "overwrite or dontOverwrite for a stage-out (an HTTP PUT or the file store "
                "replaces a file; neither can append to one)",
                "append",
            )


def requirement_refusal(
    desc: JobDescription, *, xml: bool, sites: Mapping[str, SiteProperties], site: str
) -> InvalidInput | None:
    """Why no site of ``sites`` could ever run the job (its first unmet requirement at the
    closest site), or None if one fits. ``site``: the submitting broker's (where inputs of
    unknown place are)."""
    job = desc.to_job(f"{site}.0", site)
    # A co-allocated job: each component at its site (or at some site), on its own cores.
    wanted: list[tuple[int, str | None, str]] = [(job.rank, None, desc.rank_field(xml))]
    if desc.components:
        wanted = [(c.cores, c.site, f"components[{i}]") for i, c in enumerate(desc.components)]
    for rank, at, where in wanted:
        scope = sites
        if at is not None:
            if at not in sites:
                return InvalidInput(
                    f"{where}.site", f"a site of the fleet ({known_names(sites)})", at
                )
            scope = {at: sites[at]}
        closest = closest_unmet(job.requirements, rank, scope)
        if closest is None:
            continue
        expected = f"a site of the fleet with {closest.wanted}"
        if closest.need is Need.CANDIDATE_HOSTS:
            expected += f" (names it knows: {known_names(sites)})"
        field = requirement_field(closest.need, xml)
        if closest.need == "cores":
            field = f"{where}.cores" if desc.components else where
        return InvalidInput(
            field, expected, f"{closest.has} at site {closest.site}, the closest of {len(scope)}"
        )
    return None


def refusals(
    desc: JobDescription,
    *,
    xml: bool,
    allow_private: bool,
    peers: Mapping[str, str],
    sites: Mapping[str, SiteProperties] | None,
    site: str,
) -> list[InvalidInput]:
    """Every reason a broker would refuse the job (empty: it would take it); ``sites`` None
    leaves the requirements unmatched (no fleet to match them against)."""
    found = list(staging_refusals(desc, xml=xml, allow_private=allow_private, peers=peers))
    if sites:
        unmet = requirement_refusal(desc, xml=xml, sites=sites, site=site)
        if unmet is not None:
            found.append(unmet)
    return found
