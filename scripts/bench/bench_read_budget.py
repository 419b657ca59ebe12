"""Benchmark: what reading submissions costs a real broker, and what it costs the other requests.

    python -m scripts.bench.bench_read_budget [--plain 200] [--sweeps 50] [--read-budget 5] [--json]

One ``gbroker serve`` (a 1-site topology on a free loopback port, a temporary data directory) is
started, then, each over HTTP from this process:

- **plain submit**: ``--plain`` submissions of a one-line YAML job (no sweep: read on the event
  loop, as before), one at a time; median and p90 of the round trip.
- **small sweep**: ``--sweeps`` submissions of a 10-job sweep (read in a worker process,
  gbroker.daemon.bounded); median and p90.
- **worst held loop** during each heavy request, while another thread asks ``/api/v1/health``
  over and over: the longest a health answer took (what any other client waited), and the
  heavy request's own status and time. Heavy requests: the cubic XPath sweep of issue 25, a
  10,000-job sweep submitted and sent to ``explain``, a 1 MiB YAML job (PyYAML: 1-3.5 s), a
  1 MiB JSON job.

Run it on the code before the read budget (``git stash``; without ``--read-budget``) to compare.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from gbroker.fleet.ports import free_port
from gbroker.security.auth import Tokens, bearer
from gbroker.topology import SiteSpec, Topology, save_topology
from scripts import options

PLAIN = b"executable: /bin/true\ntotal_cpu_count: {exact: 1}\n"


def sweep(values: int, variables: int = 1) -> bytes:
    environment = "".join(f"  V{k}: value-{k}\n" for k in range(variables))
    return (
        f"executable: /bin/true\narguments: [x]\nenvironment:\n{environment}"
        f"sweep:\n  assignments:\n    - parameters: ['arguments[0]']\n"
        f"      loop_integer: {{start: 1, end: {values}}}\n"
    ).encode()


def xpath_bomb(elements: int = 100) -> bytes:
    filler = "".join(f"<j:E{k}/>" for k in range(elements - 6))
    return (
        '<?xml version="1.0"?><j:JobDefinition xmlns:j="http://schemas.ggf.org/jsdl/2005/11/jsdl"'
        ' xmlns:p="http://schemas.ggf.org/jsdl/2005/11/jsdl-posix"'
        ' xmlns:sweep="http://schemas.ogf.org/jsdl/2009/03/sweep"'
        ' xmlns:fn="http://schemas.ogf.org/jsdl/2009/03/sweep/functions">'
        "<j:JobDescription><j:Application><p:POSIXApplication>"
        "<p:Executable>/bin/true</p:Executable></p:POSIXApplication></j:Application>"
        f"<j:Extra>{filler}</j:Extra></j:JobDescription><sweep:Sweep><sweep:Assignment>"
        "<sweep:DocumentNode><sweep:Match>//*[count(//*[count(//*) &gt; 0]) &gt; 0]"
        "</sweep:Match></sweep:DocumentNode><fn:Values><fn:Value>1</fn:Value></fn:Values>"
        "</sweep:Assignment></sweep:Sweep></j:JobDefinition>"
    ).encode()


def big_yaml() -> bytes:
    head = "executable: /bin/true\narguments: ["
    count = ((1 << 20) - len(head) - 100) // 2
    return (head + ",".join("a" for _ in range(count)) + "]\n").encode()


def big_json() -> bytes:
    count = ((1 << 20) - 100) // 5
    return json.dumps({"executable": "/bin/true", "arguments": ["a"] * count}).encode()


class Broker:
    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self.token = token

    def call(self, method: str, path: str, body: bytes | None = None) -> tuple[int, float]:
        request = urllib.request.Request(
            self.url + path, data=body, method=method, headers=bearer(self.token)
        )
        began = time.perf_counter()
        try:
            with urllib.request.urlopen(request, timeout=600) as response:
                response.read()
                status = response.status
        except urllib.error.HTTPError as error:
            error.read()
            status = error.code
        return status, time.perf_counter() - began


def timed(broker: Broker, body: bytes, count: int) -> dict[str, float]:
    times = []
    for _ in range(count):
        status, seconds = broker.call("POST", "/api/v1/jobs", body)
        assert status == 201, status
        times.append(seconds)
    times.sort()
    return {
        "median_ms": 1000 * statistics.median(times),
        "p90_ms": 1000 * times[int(0.9 * (len(times) - 1))],
    }


def held(broker: Broker, path: str, body: bytes) -> dict[str, Any]:
    """The heavy request's status and seconds, and the longest health answer meanwhile."""
    result: dict[str, Any] = {}

    def heavy() -> None:
        result["status"], result["seconds"] = broker.call("POST", path, body)

    thread = threading.Thread(target=heavy)
    thread.start()
    longest = 0.0
    while thread.is_alive():
        _, seconds = broker.call("GET", "/api/v1/health")
        longest = max(longest, seconds)
    thread.join()
    result["longest_health_ms"] = round(1000 * longest, 1)
    result["seconds"] = round(result["seconds"], 2)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plain", type=int, default=200)
    parser.add_argument("--sweeps", type=int, default=50)
    parser.add_argument("--read-budget", type=float, help="serve --read-budget (new code only)")
    options.add_json(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        topology = base / "one.yaml"
        save_topology(Topology([SiteSpec("solo", 2, http=url)], (), name="one"), topology)
        command = [sys.executable, "-m", "gbroker", "serve", "--site", "solo", "--topology",
                   str(topology), "--data-dir", str(base / "data")]  # fmt: skip
        if args.read_budget is not None:
            command += ["--read-budget", str(args.read_budget)]
        serve = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while True:
                with socket.socket() as s:
                    if s.connect_ex(("127.0.0.1", port)) == 0:
                        break
                if time.monotonic() > deadline or serve.poll() is not None:
                    print("gbroker serve did not start", file=sys.stderr)
                    return 1
                time.sleep(0.05)
            time.sleep(2)  # the readers start in the background
            broker = Broker(url, Tokens.load(base / "data" / "tokens").first_token())
            report: dict[str, Any] = {
                "plain submit": timed(broker, PLAIN, args.plain),
                "small sweep (10 jobs)": timed(broker, sweep(10), args.sweeps),
                "cubic XPath sweep": held(broker, "/api/v1/jobs", xpath_bomb()),
                "10,000-job sweep to explain": held(broker, "/api/v1/explain", sweep(10_000)),
                "10,000-job sweep submitted": held(broker, "/api/v1/jobs", sweep(10_000)),
                "1 MiB YAML job": held(broker, "/api/v1/jobs", big_yaml()),
                "1 MiB JSON job": held(broker, "/api/v1/jobs", big_json()),
            }
        finally:
            serve.send_signal(signal.SIGTERM)
            serve.wait(timeout=60)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for name, figures in report.items():
            shown = ", ".join(
                f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in figures.items()
            )
            print(f"{name:30} {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
