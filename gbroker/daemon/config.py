"""A broker daemon's settings (what ``gbroker serve`` builds from its command line)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gbroker.core.dispatch import DispatchPolicy
from gbroker.core.dynamite import MigrationPolicy
from gbroker.core.health import HealthPolicy
from gbroker.core.liveness import HeartbeatPolicy
from gbroker.core.localsched import QueuePolicy
from gbroker.core.malleable import MalleabilityPolicy
from gbroker.core.sdpolicy import SdPolicy
from gbroker.daemon.bounded import Budget
from gbroker.errors import InvalidInput
from gbroker.site.backend import Limits
from gbroker.site.identity import DEFAULT_RANGE
from gbroker.topology import Topology
from netmon.service import DEFAULT_PERIOD, DEFAULT_SIZES, MAX_PROBE

__all__ = ["DaemonConfig", "Retention"]


@dataclass(frozen=True, slots=True)
class Retention:
    """How long an owner keeps its finished jobs (``serve --retain-days --retain-jobs``)."""

    days: float = 30.0
    jobs: int = 1_000_000
    batch: int = 32  # jobs purged per write: a few ms of the writer (see purge_expired)
    period: float = 60.0  # seconds between purges

    def __post_init__(self) -> None:
        if not self.days > 0:  # also refuses NaN
            raise InvalidInput("retain days", "a positive number of days", self.days)
        if self.jobs < 0:
            raise InvalidInput("retain jobs", "a number of jobs >= 0", self.jobs)
        if not 1 <= self.batch <= 10_000:
            raise InvalidInput("retention batch", "1 to 10000 jobs", self.batch)
        if not self.period > 0:
            raise InvalidInput("retention period", "positive seconds", self.period)

    def describe(self) -> str:
        return f"finished jobs are kept {self.days:g} days, at most {self.jobs}"


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    site: str
    topology: Topology
    data_dir: Path
    policy: DispatchPolicy = field(default_factory=DispatchPolicy)
    queue_policy: QueuePolicy = QueuePolicy.EASY
    # Resizing running malleable jobs (KOALA's policies; None: they keep their size).
    malleability: MalleabilityPolicy | None = None
    # SD-Policy's malleable backfill (gbroker.core.sdpolicy; None: off). Not beside a KOALA
    # policy, and EASY only: the local scheduler refuses either.
    sd_policy: SdPolicy | None = None
    # Moving this owner's running jobs by Dynamite's rule (None: only when asked to).
    migrate_running: MigrationPolicy | None = None
    host: str = "127.0.0.1"
    port: int = 0
    mqtt_url: str | None = None
    mqtt_username: str | None = None  # the site's MQTT identity (gbroker.mqtt.link)
    mqtt_password: str | None = None
    dcsmon_period: float = 1.0
    # Seconds a site may start a dispatched job without asking its owner (ARCHITECTURE §6).
    lease: float = 30.0
    # Co-allocated jobs (gbroker.core.dispatch): seconds the owner holds its components' claims
    # for all to come in, and the rounds it tries before the job fails (KOALA's threshold).
    coalloc_timeout: float = 60.0
    coalloc_rounds: int = 10
    # On a clean exit, stop the jobs running here; False leaves them running for the restarted
    # broker to adopt (`gbroker serve` does that, as a restarted slurmd would).
    stop_jobs_on_exit: bool = True
    # Seconds an Idempotency-Key is remembered (gbroker.protocol.idempotency).
    idempotency_window: float = 24 * 3600.0
    max_upload: int = 1 << 30  # bytes per file in the store
    # Bytes of a moving job's bundle (files at their apparent size); None: max_upload.
    max_bundle: int | None = None
    max_download: int = 1 << 30  # bytes per staged input file
    # What reading one submission may cost: its sweep expanded and its XPaths evaluated in a
    # worker process, killed past the budget's seconds (gbroker.daemon.bounded).
    read_budget: Budget = field(default_factory=Budget)
    # Stage inputs from loopback, private and link-local hosts too (a site's own data servers).
    allow_private_sources: bool = False
    # Client tokens (gbroker.security.auth): a token file, else one admin token, else
    # <data_dir>/tokens (generated on first start). Never none.
    token_file: Path | None = None
    token: str | None = None
    # The fleet secret peers sign with; None: <data_dir>/secret (generated on first start).
    secret: str | None = None
    netmon: bool = True  # run the NetMon agent in-process (off: `gbroker netmon serve` instead)
    netmon_period: float = DEFAULT_PERIOD  # seconds between NetMon probe rounds
    netmon_sizes: tuple[int, ...] = DEFAULT_SIZES  # NetMon test sizes in bytes
    forecaster: str = "table"  # netmon.ensemble.FORECASTERS: the paper's table, or "ensemble"
    max_probe: int = MAX_PROBE  # bytes a peer's NetMon probe may carry
    dcsmon: bool = True  # publish our state in-process (off: `gbroker dcsmon serve` instead)
    # Who jobs run as (gbroker.site.executor, gbroker.site.identity): a root broker runs a
    # submitter's jobs as the local account accounts maps it to, else as a uid of its own from
    # uid_range (persisted in the host's gbroker.site.identity.host_database, under data_dir);
    # run_as instead runs every unmapped
    # submitter's jobs as that one account (the operator's explicit choice), never root unless
    # allow_root. A broker that is not root runs them as itself.
    run_as: str | None = None
    allow_root: bool = False
    accounts: Mapping[str, str] = field(default_factory=dict)
    uid_range: range = DEFAULT_RANGE
    job_limits: Limits = field(default_factory=Limits)  # the site's default limits of a job
    # A cgroup per job where the host allows it (gbroker.site.cgroups); False: rlimits only.
    job_cgroups: bool = True
    # What runs the site's jobs (gbroker.site.backend): "local" (processes of this host),
    # "slurm" (the cluster whose slurm.conf is slurm_conf; gbroker.site.slurm) or "gridengine"
    # (the cell cell_environment names: SGE_ROOT, SGE_CELL, its ports; gbroker.site.gridengine).
    manager: str = "local"
    slurm_conf: Path | None = None
    cell_environment: Mapping[str, str] | None = None
    # Where job directories live (None: <data_dir>/jobs); for a batch-system site, a directory
    # the cluster's nodes share and jobs' accounts can reach.
    jobs_dir: Path | None = None
    # TLS (gbroker.security.tls): serve HTTPS with this certificate and key (both or neither), and
    # verify peers and an mqtts:// broker against the fleet CA (None: the system's CAs).
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_ca: Path | None = None
    # How long finished jobs stay queryable (gbroker.daemon.history): days, and how many.
    retention: Retention = field(default_factory=Retention)
    # Black-hole protection of the owner (gbroker.core.health); None: off.
    black_hole: HealthPolicy | None = field(default_factory=HealthPolicy)
    # Heartbeats over HTTP to the neighbours MQTT does not speak for (gbroker.core.liveness),
    # e.g. all of them while the MQTT link is down; None: off.
    heartbeat: HeartbeatPolicy | None = field(default_factory=HeartbeatPolicy)
    # Seconds after start before a neighbour never heard from (no DCSMon state, no `online`
    # over MQTT, no heartbeat answer) is taken as idle, as the topology describes it; None:
    # never. Until then, only neighbours heard from are candidates, so a broker alone runs its
    # own jobs at once.
    neighbour_grace: float | None = None
