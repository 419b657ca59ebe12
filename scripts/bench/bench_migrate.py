"""Benchmark: what moving a running job between two sites costs, against its state's size.

    python -m scripts.bench.bench_migrate [--sizes 1,10,100,1000] [--app-sizes 1,1000]
                                    [--repeats 3] [--json] [--dir DIR]

Run as root, with CRIU (``bash scripts/setup/ensure_criu.sh`` builds it; found as
:func:`gbroker.site.criu.find_criu` finds it). It starts its own 2-site fleet (``gbroker fleet
up`` of sites ``a`` and ``b``, 2 cores each, neighbours; :func:`orderly.fleet`) and brings it
down at the end, also on a failure, Ctrl-C, SIGTERM or SIGHUP (exit 128 + the signal's number);
the brokers run with ``--stop-jobs-on-exit``.

For each state size S in ``--sizes`` (megabytes), ``--repeats`` times:

1. it submits a job (``python3``, 1 core) that fills a ``bytearray`` of S MB from
   ``os.urandom`` (touched pages of random bytes: nothing CRIU could skip as zero pages), prints
   ``ready`` and then a heartbeat every 0.1 s; waits until the job runs and has said ``ready``;
2. runs ``gbroker migrate JOB`` (to the other site, the best one) and times the whole command,
   a process start included (the time a user waits);
3. reads each step's time from the two brokers' ``/metrics`` (``gbroker_move_step_seconds``:
   the ``_sum`` and ``_count`` of each step before and after the move; each step is observed
   once per move): *checkpoint* (the CRIU dump, with its freeze) and *bundle* (one tar of the
   image and the job's directory, and its sha256) at the source; *transfer* (the target fetches
   the bundle over HTTP from the source, checking its sha256), *unpack* and *restore* (the
   image rewritten for its new directory and account by CRIU's ``crit``, then ``criu restore``
   under an init in a PID namespace of its own) at the target; and the bundle's bytes
   (``gbroker_move_bundle_bytes_total`` at the source);
4. checks that the job runs at the target (its status, and its heartbeat goes on there), then
   cancels it and waits until it has ended;
5. the peer, **CRIU alone**: the same program, started here as root in a session of its own
   with its output in a file, is dumped with the same ``criu`` binary (``criu dump --tree PID
   --images-dir D``) and restored from D (``criu restore --restore-detached``) on the same
   file system; each command timed, then the restored process is checked to run, and killed.
   That is the floor under GBroker's checkpoint and restore.

Then the same for **the job's own saved state** (``application`` in the table) at each size of
``--app-sizes`` (default one small, one large; empty: none): a job using
``gbroker.app.malleable``'s ``on_checkpoint`` hook, whose state is S MB of random bytes; it is
moved by that state (saved into its directory at its next safe point, the job started again at
the target reading it back), not by CRIU; it prints the CRC-32 of its state when ready, and
the check after the move is that it prints the same CRC-32 again at the target.

The table has, per size and kind, the median over the repeats of each figure and, on the line
below, its min-max. ``--json`` prints every sample instead, with the machine (CPUs, kernel,
CRIU's version), the date and the command line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gbroker.security.auth import Tokens, bearer
from gbroker.site.criu import criu_works, find_criu
from scripts import options, orderly

MB = 1 << 20
STEPS = ("checkpoint", "bundle", "transfer", "unpack", "restore")
"""The steps of a move, as ``gbroker_move_step_seconds{step}`` names them."""
KINDS = ("criu", "application")
TOPOLOGY = """name: bench-migrate
sites:
  - {name: a, cores: 2}
  - {name: b, cores: 2}
neighbourhood: full
"""

# Moved by CRIU: S MB of touched random bytes in its memory, then a heartbeat.
HOLDER = """
import os, sys, time
size = int(sys.argv[1])
state = bytearray(size)
for at in range(0, size, 1 << 20):
    state[at:at + (1 << 20)] = os.urandom(min(1 << 20, size - at))
print("ready", flush=True)
beat = 0
while True:
    beat += 1
    print("beat", beat, flush=True)
    time.sleep(0.1)
"""

# Moved by its own saved state: S MB of random bytes it saves at its safe point.
OWN_STATE = """
import os, sys, time, zlib
from gbroker.app import malleable
size = int(sys.argv[1])
state = malleable.restored()
if state is None:
    state = b"".join(os.urandom(min(1 << 20, size - at)) for at in range(0, size, 1 << 20))
print("ready", zlib.crc32(state), flush=True)
malleable.serve(on_checkpoint=lambda: state)
beat = 0
while True:
    malleable.safe_point()
    beat += 1
    print("beat", beat, flush=True)
    time.sleep(0.1)
"""


class BenchError(Exception):
    """The benchmark could not measure something; the message says what, for people."""


def poll(condition: Callable[[], Any], what: str, timeout: float) -> Any:
    """``condition()``'s first truthy value, looked at every 0.05 s; :class:`BenchError` if
    none comes within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise BenchError(f"{what}: not within {timeout:g} s")
        time.sleep(0.05)


class Broker:
    """A site's broker, over HTTP with the fleet's admin token."""

    def __init__(self, site: str, url: str, token: str) -> None:
        self.site = site
        self.url = url.rstrip("/")
        self.headers = bearer(token)

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        data = None if body is None else json.dumps(body).encode()
        headers = {**self.headers, "Content-Type": "application/json"}
        request = urllib.request.Request(self.url + path, data, headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def json(self, method: str, path: str, body: Any = None) -> Any:
        status, answer = self.request(method, path, body)
        if status >= 300:
            raise BenchError(f"{method} {self.site}{path}: {status} {answer[:300]!r}")
        return json.loads(answer)

    def metrics(self) -> dict[str, float]:
        """Each step's ``_sum`` and ``_count`` (``sum:STEP``, ``count:STEP``) and the bundle
        bytes sent (``bytes``), as the broker's /metrics says now."""
        status, text = self.request("GET", "/metrics")
        if status != 200:
            raise BenchError(f"GET {self.site}/metrics: {status}")
        found: dict[str, float] = {"bytes": 0.0}
        for family in text_string_to_metric_families(text.decode()):
            for sample in family.samples:
                step = sample.labels.get("step")
                if sample.name == "gbroker_move_step_seconds_sum" and step:
                    found[f"sum:{step}"] = sample.value
                elif sample.name == "gbroker_move_step_seconds_count" and step:
                    found[f"count:{step}"] = sample.value
                elif sample.name == "gbroker_move_bundle_bytes_total":
                    found["bytes"] = sample.value
        return found


def _delta(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]) -> Any:
    """What the move added to the brokers' figures, summed over both (a step is observed where
    it ran: checkpoint and bundle at the source, the others at the target)."""
    added = {
        key: sum(after[site].get(key, 0.0) - before[site].get(key, 0.0) for site in after)
        for key in {key for figures in after.values() for key in figures}
    }
    return added


class Bench:
    """The fleet's brokers, the job programs, and one move measured at a time."""

    def __init__(self, fleet_dir: Path, home: Path, record: dict[str, Any], criu: str) -> None:
        self.fleet_dir = fleet_dir
        self.home = home
        self.criu = criu
        token = Tokens.load(fleet_dir / "tokens").first_token()
        self.brokers = {
            site: Broker(site, member["url"], token) for site, member in record["sites"].items()
        }
        self.python = shutil.which("python3") or sys.executable

    def gbroker(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GBROKER_")}
        if "GBROKER_RUNTIME_DIR" in os.environ:
            env["GBROKER_RUNTIME_DIR"] = os.environ["GBROKER_RUNTIME_DIR"]
        env["GBROKER_FLEET"] = str(self.fleet_dir)
        done: subprocess.CompletedProcess[str] = orderly.run_process(
            [sys.executable, "-m", "gbroker", *args], env=env, text=True
        )
        return done

    def status(self, job_id: str) -> dict[str, Any]:
        status: dict[str, Any] = self.brokers["a"].json("GET", f"/api/v1/jobs/{job_id}")
        return status

    def output(self, job_id: str) -> str:
        status, body = self.brokers["a"].request("GET", f"/api/v1/jobs/{job_id}/output/stdout")
        return body.decode(errors="replace") if status == 200 else ""

    def move(self, kind: str, size: int) -> dict[str, float]:
        """One job of ``size`` bytes moved by ``kind``: its figures."""
        program = HOLDER if kind == "criu" else OWN_STATE
        description = {
            "name": f"bench-migrate-{kind}",
            "executable": "python3",
            "arguments": ["-u", "-c", program, str(size)],
            "total_cpu_count": {"exact": 1},
        }
        job_id = str(self.brokers["a"].json("POST", "/api/v1/jobs", description)["id"])
        try:
            return self._measure(job_id, kind, size)
        finally:
            self.brokers["a"].request("DELETE", f"/api/v1/jobs/{job_id}")
            poll(
                lambda: self.status(job_id)["state"] not in ("running", "queued", "pending"),
                f"{job_id} ends once cancelled",
                120,
            )

    def _measure(self, job_id: str, kind: str, size: int) -> dict[str, float]:
        wait = 60 + size / MB * 0.2  # the job's start and its filling its memory
        poll(lambda: self.status(job_id)["state"] == "running", f"{job_id} runs", wait)
        ready = poll(
            lambda: next(
                (x for x in self.output(job_id).splitlines() if x.startswith("ready")), ""
            ),
            f"{job_id} says ready",
            wait,
        )
        source = str(self.status(job_id)["site"])
        before = {site: broker.metrics() for site, broker in self.brokers.items()}
        began = time.perf_counter()
        moved = self.gbroker("migrate", job_id)
        whole = time.perf_counter() - began
        if moved.returncode != 0:
            raise BenchError(f"gbroker migrate {job_id} exited {moved.returncode}: {moved.stderr}")
        status = self.status(job_id)
        if status["state"] != "running" or status["site"] == source:
            raise BenchError(
                f"{job_id} is {status['state']} at {status['site']} after its move from {source}"
            )

        def observed() -> dict[str, float] | None:
            after = {site: broker.metrics() for site, broker in self.brokers.items()}
            added = _delta(before, after)
            return added if all(added.get(f"count:{s}", 0) >= 1 for s in STEPS) else None

        try:
            added = poll(observed, "every step of the move in the brokers' /metrics", 30)
        except BenchError:
            after = {site: broker.metrics() for site, broker in self.brokers.items()}
            added = _delta(before, after)
            missing = [s for s in STEPS if added.get(f"count:{s}", 0) < 1]
            raise BenchError(
                f"{job_id}'s move: gbroker_move_step_seconds has no {', '.join(missing)} "
                "observation at either broker"
            ) from None
        # It runs there: its heartbeat goes on past what it had said when the move ended.
        said = self.output(job_id)
        last = _last_beat(said)
        poll(lambda: _last_beat(self.output(job_id)) > last, f"{job_id} beats at the target", 60)
        if kind == "application":
            readies = [x for x in self.output(job_id).splitlines() if x.startswith("ready")]
            if readies != [ready, ready]:
                raise BenchError(f"{job_id}: its state came back other: {readies}")
        figures = {s: added[f"sum:{s}"] for s in STEPS}
        figures["migrate"] = whole
        figures["bundle_bytes"] = added["bytes"]
        return figures

    def criu_alone(self, size: int, into: Path) -> dict[str, float]:
        """The same program, dumped and restored by CRIU alone; the seconds of each."""
        shutil.rmtree(into, ignore_errors=True)
        images = into / "images"
        images.mkdir(parents=True)
        out = into / "out"
        pidfile = into / "restored.pid"
        restored: int | None = None
        with out.open("w") as stdout:
            process = subprocess.Popen(
                [self.python, "-u", "-c", HOLDER, str(size)],
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=subprocess.STDOUT,
                cwd=into,
                start_new_session=True,  # a session leader: CRIU dumps it without --shell-job
            )
        try:
            poll(lambda: "ready" in out.read_text(), "the CRIU-alone process says ready", 120)
            dump = [self.criu, "dump", "--tree", str(process.pid), "--images-dir", str(images)]
            began = time.perf_counter()
            done = orderly.run_process([*dump, "--log-file", "dump.log"])
            dumped = time.perf_counter() - began
            if done.returncode != 0:
                raise BenchError(f"criu dump exited {done.returncode}: {_log(images / 'dump.log')}")
            process.wait(30)  # CRIU kills it once dumped
            restore = [self.criu, "restore", "--images-dir", str(images), "--restore-detached"]
            began = time.perf_counter()
            done = orderly.run_process(
                [*restore, "--pidfile", str(pidfile), "--log-file", "restore.log"]
            )
            restoring = time.perf_counter() - began
            if done.returncode != 0:
                raise BenchError(
                    f"criu restore exited {done.returncode}: {_log(images / 'restore.log')}"
                )
            restored = int(pidfile.read_text())
            last = _last_beat(out.read_text())
            poll(lambda: _last_beat(out.read_text()) > last, "the restored process beats", 30)
        finally:
            for pid in (process.pid, restored):
                if pid is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(10)
            if restored is not None:  # orphaned to init, which reaps it
                gone = restored
                poll(lambda: _gone(gone), f"the restored process {gone} ends", 30)
            shutil.rmtree(into, ignore_errors=True)
        return {"criu_dump": dumped, "criu_restore": restoring}


def _ready_line(output: str) -> str:
    return next((line for line in output.splitlines() if line.startswith("ready")), "")


def _last_beat(output: str) -> int:
    beats = [line.split()[1] for line in output.splitlines() if line.startswith("beat ")]
    return int(beats[-1]) if beats and beats[-1].isdigit() else 0


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _log(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"(no log: {exc.strerror})"
    errors = [line for line in lines if "Error" in line] or lines
    return " | ".join(errors[-3:])


def _criu_version(criu: str) -> str:
    done = subprocess.run([criu, "--version"], capture_output=True, text=True)
    first = done.stdout.splitlines()[0] if done.returncode == 0 and done.stdout else "?"
    return "CRIU " + first.removeprefix("Version:").strip()


def _summary(samples: list[float]) -> dict[str, Any]:
    return {
        "median": statistics.median(samples),
        "min": min(samples),
        "max": max(samples),
        "samples": samples,
    }


COLUMNS = (
    ("checkpoint", "checkpoint"),
    ("bundle", "bundle"),
    ("transfer", "transfer"),
    ("unpack", "unpack"),
    ("restore", "restore"),
    ("migrate", "migrate"),
    ("bundle_bytes", "bundle MB"),
    ("criu_dump", "CRIU dump"),
    ("criu_restore", "CRIU rest."),
)


def _cell(key: str, value: float) -> str:
    if key == "bundle_bytes":
        return f"{value / MB:.0f}" if value >= 100 * MB else f"{value / MB:.1f}"
    return f"{value:.2f}"


def report(figures: dict[str, Any]) -> None:
    """The table: per row the medians, and below them min-max."""
    machine = figures["machine"]
    print(
        f"Moving a running job between the 2 sites of a fleet on one machine ({machine['cpus']} "
        f"CPUs, Linux {machine['kernel']}, {machine['criu']}), {figures['repeats']} repeats; "
        "seconds (medians, min-max below)"
    )
    width = 12  # a space, then up to 11 characters: "19.39-25.49"
    head = f"{'state':>8} {'kind':<12}" + "".join(f"{label:>{width}}" for _, label in COLUMNS)
    print(head)
    for row in figures["rows"]:
        medians = maxima = ""
        for key, _ in COLUMNS:
            summary = row.get(key)
            if summary is None:
                medians += f"{'-':>{width}}"
                maxima += f"{'':>{width}}"
                continue
            medians += f"{_cell(key, summary['median']):>{width}}"
            spread = f"{_cell(key, summary['min'])}-{_cell(key, summary['max'])}"
            maxima += f"{spread:>{width}}"
        print(f"{str(row['size_mb']) + ' MB':>8} {row['kind']:<12}" + medians)
        print((f"{'':>8} {'':<12}" + maxima).rstrip())
    print(
        "checkpoint, bundle: at the source; transfer, unpack, restore: at the target (the\n"
        "brokers' gbroker_move_step_seconds); migrate: the whole `gbroker migrate JOB` command,\n"
        "its process start and its status polls (0.1 s apart, backing off to 1 s) included;\n"
        "bundle MB: the tar of the image (or saved state) and the job's directory; CRIU dump /\n"
        "rest.: `criu dump` and `criu restore -d` of the same program alone, same binary, same\n"
        "file system (application rows: not moved by CRIU, '-')."
    )


def _sizes(text: str, flag: str, empty: bool) -> list[int]:
    """Megabytes, comma-separated; an error line naming ``flag`` if they are not."""
    if empty and text.strip() == "":
        return []
    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or any(size < 1 for size in sizes):
        raise ValueError(
            f"{flag}: expected megabytes as integers >= 1 separated by commas "
            f"(e.g. 1,10,100), got {text!r}"
        )
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench_migrate.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--sizes", default="1,10,100,1000", help="state sizes moved by CRIU, MB (1,10,100,1000)"
    )
    parser.add_argument(
        "--app-sizes",
        default="1,1000",
        help="state sizes moved by the job's own saved state, MB (1,1000; '' for none)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="moves per size and kind (3)")
    options.add_json(parser, "every sample")
    parser.add_argument("--dir", type=Path, help="where the fleet lives (default: a temp dir)")
    args = parser.parse_args(argv)
    try:
        sizes = _sizes(args.sizes, "--sizes", empty=False)
        app_sizes = _sizes(args.app_sizes, "--app-sizes", empty=True)
    except ValueError as exc:
        parser.error(str(exc))
    if args.repeats < 1:
        parser.error(f"--repeats: expected an integer >= 1, got {args.repeats}")
    if os.geteuid() != 0:
        print(
            "bench_migrate: must run as root: CRIU checkpoints, and jobs run as their users, "
            "need it (CI runs as root)",
            file=sys.stderr,
        )
        return 2
    criu = find_criu()
    if criu is None:
        print(
            "bench_migrate: CRIU is missing: bash scripts/setup/ensure_criu.sh builds it",
            file=sys.stderr,
        )
        return 2
    if not criu_works(criu):
        print(f"bench_migrate: `{criu} check` fails here: CRIU cannot run", file=sys.stderr)
        return 2
    figures: dict[str, Any] = {
        "command": ["scripts/bench/bench_migrate.py", *(sys.argv[1:] if argv is None else argv)],
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": {
            "cpus": len(os.sched_getaffinity(0)),
            "kernel": platform.release(),
            "criu": _criu_version(criu),
        },
        "repeats": args.repeats,
        "rows": [],
    }
    plan = [("criu", size) for size in sizes] + [("application", size) for size in app_sizes]
    try:
        with orderly.temporary_directory("gbroker-bench-migrate-", args.dir) as home:
            home.chmod(0o711)  # every job's uid may traverse it
            topology = home / "bench-migrate.yaml"
            topology.write_text(TOPOLOGY)
            fleet_dir = home / "fleet"
            print("a 2-site fleet ...", file=sys.stderr)
            with orderly.fleet(topology, fleet_dir, serve_args=("--stop-jobs-on-exit",)) as record:
                bench = Bench(fleet_dir, home, record, criu)
                for kind, size in plan:
                    samples: dict[str, list[float]] = {}
                    for repeat in range(args.repeats):
                        print(
                            f"{size} MB by {kind}, move {repeat + 1} of {args.repeats} ...",
                            file=sys.stderr,
                        )
                        measured = bench.move(kind, size * MB)
                        if kind == "criu":
                            print(f"{size} MB by CRIU alone ...", file=sys.stderr)
                            measured |= bench.criu_alone(size * MB, home / "criu-alone")
                        for key, value in measured.items():
                            samples.setdefault(key, []).append(value)
                    row: dict[str, Any] = {"size_mb": size, "kind": kind}
                    row |= {key: _summary(values) for key, values in samples.items()}
                    figures["rows"].append(row)
    except BenchError as exc:
        print(f"bench_migrate: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        report(figures)
    return 0


if __name__ == "__main__":
    orderly.run(main)
