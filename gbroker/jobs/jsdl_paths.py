"""Where a description's fields stand in a JSDL document: the element paths that errors name,
shared by the reader (:mod:`.jsdl_read`), the checks made after reading
(:mod:`.description`) and what a broker refuses at submission (:mod:`.admission`)."""

from __future__ import annotations

__all__ = ["APP", "DESC", "RES", "ROOT", "SCHED", "XML_PATHS"]

ROOT = "JobDefinition"
DESC = "JobDefinition/JobDescription"
APP = f"{DESC}/Application"
RES = f"{DESC}/Resources"
SCHED = f"{DESC}/Scheduling"

# Where a field of JobDescription lives in a document, for errors found after reading.
XML_PATHS = {
    "number_of_processes": f"{APP}/SPMDApplication/NumberOfProcesses",
    "spmd_variation": f"{APP}/SPMDApplication/SPMDVariation",
    "total_cpu_count": f"{RES}/TotalCPUCount",
    "individual_cpu_count": f"{RES}/IndividualCPUCount",
    "job_class": f"{SCHED}/JobClass",
    "min_cores": f"{SCHED}/MinCores",
    "max_cores": f"{SCHED}/MaxCores",
    "executable": APP,
    "total_resource_count": f"{RES}/TotalResourceCount",
}
