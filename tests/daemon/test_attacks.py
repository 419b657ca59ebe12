"""Attacks from issue 9, tried against a fleet of real broker processes started by the CLI.

Each test is one attack as a user (or a process) on the same host would make it, against what
users run: ``gbroker fleet up`` with its defaults. Each asserts the precise refusal, and the
module ends by checking that the fleet still serves jobs after all of them.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import pytest
from yarl import URL

from gbroker.security.auth import PeerSigner, Tokens, bearer
from gbroker.topology import SiteSpec, Topology, save_topology
from tests.harness import gbroker

pytestmark = pytest.mark.network

SLEEPER = "executable: /bin/sleep\narguments: ['30']\ntotal_cpu_count: {exact: 1}\n"
ECHO = "executable: /bin/echo\narguments: [hello]\ntotal_cpu_count: {exact: 1}\n"


@dataclass
class Fleet:
    directory: Path
    urls: dict[str, str]
    token: str
    secret: str
    pids: dict[str, int]

    def sign(self, site: str, method: str, url: str, body: bytes | None = b"") -> dict[str, str]:
        """A peer signature by ``site`` for the site whose broker ``url`` is."""
        to = next(name for name, base in self.urls.items() if url.startswith(base + "/"))
        return PeerSigner(site, self.secret).headers(method, URL(url).path_qs, body, to=to)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    base = tmp_path_factory.mktemp("attacks")
    os.chmod(base, 0o755)  # the attacker (nobody) may look around, as on a shared host
    topology = base / "two.yaml"
    save_topology(Topology([SiteSpec("a", 2), SiteSpec("b", 4)], "full", name="two"), topology)
    directory = base / "fleet"
    started = gbroker("fleet", "up", "--topology", str(topology), "--dir", str(directory))
    assert started.returncode == 0, started.stderr
    record = json.loads((directory / "fleet.json").read_text())
    try:
        yield Fleet(
            directory,
            {name: m["url"] for name, m in record["sites"].items()},
            Tokens.load(Path(record["tokens"])).first_token(),
            (directory / "secret").read_text().strip(),
            {name: m["pid"] for name, m in record["sites"].items()},
        )
    finally:
        stopped = gbroker("fleet", "down", "--dir", str(directory))
        assert stopped.returncode == 0, stopped.stderr


def http(
    method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    """One real HTTP request: (status, decoded JSON or text)."""
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def submit(fleet: Fleet, site: str, job: str = ECHO) -> str:
    status, body = http(
        "POST", f"{fleet.urls[site]}/api/v1/jobs", job.encode(), bearer(fleet.token)
    )
    assert status == 201, body
    return str(body["id"])


def job_status(fleet: Fleet, job_id: str, wait: float = 0) -> dict[str, Any]:
    suffix = f"/wait?timeout={wait}" if wait else ""
    url = f"{fleet.urls['a']}/api/v1/jobs/{job_id}{suffix}"
    status, body = http("GET", url, headers=bearer(fleet.token))
    assert status == 200, body
    return dict(body)


def peer_call(fleet: Fleet, site: str, target: str, path: str, message: dict[str, Any]) -> Any:
    url = fleet.urls[target] + path
    data = msgpack.packb(message)
    headers = {**fleet.sign(site, "POST", url, data), "Content-Type": "application/msgpack"}
    return http("POST", url, data, headers)


# --- nobody runs anything without a token --------------------------------------------------------


ATTACKER = """
import json, sys, urllib.error, urllib.request
url, tokens = sys.argv[1], sys.argv[2]
try:
    open(tokens).read()
    readable = True
except PermissionError:
    readable = False
request = urllib.request.Request(url + "/api/v1/jobs", method="POST",
    data=b'{"executable": "/usr/bin/id"}', headers={"Content-Type": "application/json"})
try:
    urllib.request.urlopen(request, timeout=10)
    status = 200
except urllib.error.HTTPError as error:
    status = error.code
print(json.dumps({"tokens_readable": readable, "status": status}))
"""


def test_another_user_can_neither_submit_nor_read_the_token(fleet: Fleet) -> None:
    if os.geteuid() != 0:
        pytest.fail("this test plays another user: it needs root (CI runs as root)")
    result = subprocess.run(
        [
            "/usr/bin/python3",
            "-I",
            "-c",
            ATTACKER,
            fleet.urls["a"],
            str(fleet.directory / "tokens"),
        ],
        user="nobody",
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"tokens_readable": False, "status": 401}


def test_a_browser_shaped_request_is_refused(fleet: Fleet) -> None:
    url = f"{fleet.urls['a']}/api/v1/jobs"
    body = b'{"executable": "/usr/bin/id"}'
    for headers in (
        {"Content-Type": "text/plain", "Host": "attacker.example:80"},  # DNS rebinding
        {"Content-Type": "text/plain", "Origin": "http://attacker.example"},  # cross-site
    ):
        status, answer = http("POST", url, body, {**headers, **bearer(fleet.token)})
        assert status == 403, answer
        assert answer["error"].startswith("forbidden: ")


def test_wrong_and_non_ascii_credentials_get_401(fleet: Fleet) -> None:
    url = f"{fleet.urls['a']}/api/v1/jobs"
    for authorization in ("Bearer wrong-token-0123456789", "Bearer töken-ünicode-ß", "Basic x"):
        status, answer = http("GET", url, headers={"Authorization": authorization})
        assert status == 401, answer
        assert "client token" in answer["error"]


def test_no_token_or_secret_on_any_command_line(fleet: Fleet) -> None:
    for pid in fleet.pids.values():
        command = Path(f"/proc/{pid}/cmdline").read_bytes().decode()
        assert fleet.token not in command
        assert fleet.secret not in command
    for name in ("tokens", "secret"):
        assert (fleet.directory / name).stat().st_mode & 0o777 == 0o600
    journal = fleet.directory / "a" / "journal.sqlite"
    assert journal.stat().st_mode & 0o777 == 0o600
    assert (fleet.directory / "a").stat().st_mode & 0o777 == 0o711
    jobs = fleet.directory / "a" / "jobs"  # passed through to a job's own, never listed
    assert jobs.stat().st_mode & 0o777 == 0o711


# --- peers: a signature under the fleet secret, and a site speaks only for itself ---------------


def test_unsigned_and_forged_peer_messages_get_401(fleet: Fleet) -> None:
    job_id = submit(fleet, "a", SLEEPER)
    report = {"id": job_id, "site": "Mars", "kind": "finished", "ok": True}
    url = fleet.urls["a"] + "/peer/v1/report"
    data = msgpack.packb(report)
    assert http("POST", url, data)[0] == 401  # no signature
    assert http("POST", url, data, bearer(fleet.token))[0] == 401  # a client token is no peer's
    forged = PeerSigner("b", "not the fleet secret").headers(
        "POST", "/peer/v1/report", data, to="a"
    )
    assert http("POST", url, data, forged)[0] == 401
    mars = PeerSigner("Mars", fleet.secret).headers("POST", "/peer/v1/report", data, to="a")
    assert http("POST", url, data, mars)[0] == 401  # not a site of the topology
    replayed = fleet.sign("b", "POST", url, data)
    http("POST", url, data, replayed)
    status, answer = http("POST", url, data, replayed)
    assert (status, "replayed" in str(answer)) == (401, True)
    kill = msgpack.packb({"id": job_id})
    assert http("POST", fleet.urls["a"] + "/peer/v1/kill", kill)[0] == 401
    assert job_status(fleet, job_id)["state"] in ("queued", "running", "staging")
    assert (
        http("DELETE", f"{fleet.urls['a']}/api/v1/jobs/{job_id}", headers=bearer(fleet.token))[0]
        == 200
    )


def test_a_peer_speaks_only_for_its_own_placements_and_jobs(fleet: Fleet) -> None:
    job_id = submit(fleet, "a", SLEEPER)  # a's job, running at a (it fits there)
    deadline = time.monotonic() + 20
    while job_status(fleet, job_id)["state"] != "running" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert job_status(fleet, job_id)["site"] == "a"
    # b is a real peer with the secret, but the job is not placed at b.
    finished = {"id": job_id, "site": "b", "kind": "finished", "ok": True, "at": time.time()}
    status, answer = peer_call(fleet, "b", "a", "/peer/v1/report", finished)
    assert (status, answer) == (403, f"forbidden: {job_id} is not placed at b")
    # b cannot report in a's name either.
    as_a = {**finished, "site": "a"}
    status, answer = peer_call(fleet, "b", "a", "/peer/v1/report", as_a)
    assert (status, answer) == (403, "forbidden: b cannot report for a")
    # Only the owner kills, withdraws or dispatches its jobs.
    for path in ("/peer/v1/kill", "/peer/v1/withdraw"):
        status, answer = peer_call(fleet, "b", "a", path, {"id": job_id})
        assert (status, answer) == (403, f"forbidden: b does not own {job_id}"), path
    accept = {
        "id": "a.1",
        "owner": "a",
        "replica": False,
        "lease": 30.0,
        "description": {"executable": "/bin/true"},
    }
    status, answer = peer_call(fleet, "b", "a", "/peer/v1/accept", accept)
    assert (status, answer) == (403, "forbidden: b does not own a.1")
    status, answer = peer_call(fleet, "b", "a", "/peer/v1/claim", {"id": job_id, "site": "a"})
    assert (status, answer) == (403, "forbidden: b cannot claim for a")
    url = f"{fleet.urls['a']}/peer/v1/output/{job_id}/stdout"
    assert http("GET", url, headers=fleet.sign("b", "GET", url))[0] == 403
    assert job_status(fleet, job_id)["state"] == "running"  # none of it touched the job
    http("DELETE", f"{fleet.urls['a']}/api/v1/jobs/{job_id}", headers=bearer(fleet.token))


# --- MQTT: no anonymous client, and a site publishes only as itself ---------------------------


def test_mqtt_refuses_anonymous_clients_and_other_sites_topics(fleet: Fleet) -> None:
    import asyncio

    import aiomqtt

    from gbroker.mqtt.accounts import read_password_file
    from gbroker.mqtt.topics import alive_topic

    record = json.loads((fleet.directory / "fleet.json").read_text())
    url = URL(record["mqtt_url"])
    host, port = str(url.host), int(url.port or 0)

    async def anonymous() -> None:
        async with aiomqtt.Client(host, port, identifier="attacker", timeout=5):
            pass

    with pytest.raises(aiomqtt.MqttError):
        asyncio.run(anonymous())

    password = read_password_file(fleet.directory / "mqtt" / "a.password")

    async def heard_on_b_alive(publish: bytes | None) -> set[object]:
        """What a new subscriber hears on b's liveness topic within 2 s, after site a (with
        its own password) has published ``publish`` there, retained."""
        async with aiomqtt.Client(
            host, port, identifier="gbroker-a/attacker", username="a", password=password
        ) as a:
            if publish is not None:
                await a.publish(alive_topic("b"), publish, qos=1, retain=True)
            await a.subscribe(alive_topic("b"))
            heard: set[object] = set()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2):
                    async for message in a.messages:
                        if message.topic.matches(alive_topic("b")):
                            heard.add(message.payload)
            return heard

    assert asyncio.run(heard_on_b_alive(b"offline")) == {b"online"}  # b's own, retained
    assert asyncio.run(heard_on_b_alive(None)) == {b"online"}  # the forgery was not kept
    _, health = http("GET", f"{fleet.urls['a']}/api/v1/info", headers=bearer(fleet.token))
    assert [(n["site"], n["status"]) for n in health["neighbours"]] != [("b", "offline")]


# --- jobs: an unprivileged account, their own cores, their own directory -------------------------


def run_to_end(fleet: Fleet, site: str, script: str, cores: int = 1) -> tuple[dict[str, Any], str]:
    job = json.dumps(
        {
            "executable": "/bin/sh",
            "arguments": ["-c", script],
            "total_cpu_count": {"exact": cores},
        }
    )
    job_id = submit(fleet, site, job)
    final = job_status(fleet, job_id, wait=30)
    status, output = http(
        "GET", f"{fleet.urls[site]}/api/v1/jobs/{job_id}/output/stdout", headers=bearer(fleet.token)
    )
    return final, str(output) if status == 200 else f"HTTP {status}: {output}"


def test_a_job_runs_unprivileged_on_its_own_cores_in_a_private_directory(fleet: Fleet) -> None:
    final, output = run_to_end(
        fleet,
        "b",
        "id -u; grep Cpus_allowed_list /proc/self/status | cut -f2; stat -c %a:%u .;"
        " echo $GBROKER_CPUS",
        cores=1,
    )
    assert final["state"] == "done", final
    uid, allowed, directory, cpus = output.split()
    assert int(uid) != 0
    assert int(uid) != 65534 or os.geteuid() != 0  # a uid of its user's own, not nobody
    assert directory == f"700:{uid}"  # its directory is its own, closed to the others
    assert allowed == cpus  # bound to exactly the CPUs of its allocation
    assert len(cpus.split(",")) == 1


def test_a_planted_link_does_not_make_the_broker_serve_another_file(fleet: Fleet) -> None:
    final, output = run_to_end(fleet, "a", "rm stdout; ln -s /etc/shadow stdout")
    assert final["state"] == "done", final
    assert output.startswith("HTTP 403"), output
    assert "root:" not in output


# --- client requests are checked before they go anywhere ----------------------------------------


BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8)
)


@pytest.mark.parametrize(
    ("name", "body", "field"),
    [
        (
            "staging outside the job directory",
            ECHO + "staging: [{file_name: ../../../../x, inline_data: owned}]\n",
            "staging[0].file_name",
        ),
        (
            "staging to an absolute path",
            ECHO + "staging: [{file_name: /tmp/x, inline_data: x}]\n",
            "staging[0].file_name",
        ),
        (
            "a stage-in from the host's own loopback",
            ECHO + "staging: [{file_name: f, source: "
            "'http://127.0.0.1:1/files/" + "0" * 64 + "'}]\n",
            "staging[0].source",
        ),
        (
            "a stage-in from the cloud metadata address",
            ECHO + "staging: [{file_name: f, source: 'http://169.254.169.254/latest'}]\n",
            "staging[0].source",
        ),
        (
            "a stage-in over ftp",
            ECHO + "staging: [{file_name: f, source: 'ftp://x.org/f'}]\n",
            "staging[0].source",
        ),
        ("an output outside the job directory", ECHO + "output: /etc/passwd\n", "output"),
        ("a working directory above it", ECHO + "working_directory: ../..\n", "working_directory"),
        ("a huge core count", ECHO.replace("exact: 1", "exact: 1e23"), "total_cpu_count"),
        ("a YAML alias bomb", BOMB, "line 1, column 4"),
    ],
)
def test_bad_job_descriptions_get_a_short_precise_400(
    fleet: Fleet, name: str, body: str, field: str
) -> None:
    began = time.monotonic()
    status, answer = http(
        "POST", f"{fleet.urls['a']}/api/v1/jobs", body.encode(), bearer(fleet.token)
    )
    assert status == 400, (name, answer)
    assert field in answer["field"], (name, answer)
    assert len(json.dumps(answer)) < 600, (name, answer)
    assert time.monotonic() - began < 5, name


def test_poisoned_peer_messages_get_400_and_the_journal_lives_on(fleet: Fleet) -> None:
    for path, message in (
        ("/peer/v1/report", {"id": 2**63, "site": "b", "kind": "finished", "ok": True, "at": 1}),
        ("/peer/v1/report", {"id": "a.1", "site": "b", "kind": "started", "at": float("nan")}),
        (
            "/peer/v1/accept",
            {
                "id": "b.1",
                "owner": "b",
                "replica": False,
                "lease": 1e300,
                "description": {"executable": "/bin/true"},
            },
        ),
        ("/peer/v1/claim", {"id": "a.1/../x", "site": "b"}),
        ("/peer/v1/withdraw", [1, 2, 3]),
    ):
        status, answer = peer_call(fleet, "b", "a", path, message)  # type: ignore[arg-type]
        assert status == 400, (path, message, answer)
        assert answer.startswith("bad peer message: "), answer
    status, health = http("GET", f"{fleet.urls['a']}/api/v1/health", headers=bearer(fleet.token))
    assert (status, health["journal"]["ok"]) == (200, True)
    submit(fleet, "a")  # and submissions still go through


def test_a_job_id_is_checked_before_it_is_forwarded(fleet: Fleet) -> None:
    url = f"{fleet.urls['b']}/api/v1/jobs/a.1%2F..%2F..%2Fmetrics"
    status, answer = http("GET", url, headers=bearer(fleet.token))
    assert status == 400, answer
    assert answer["field"] == "job id"


def test_asking_about_a_job_whose_owner_is_down_says_so(fleet: Fleet) -> None:
    job_id = submit(fleet, "a")
    assert gbroker("fleet", "kill", "a", "--dir", str(fleet.directory)).returncode == 0
    try:
        url = f"{fleet.urls['b']}/api/v1/jobs/{job_id}"
        status, answer = http("GET", url, headers=bearer(fleet.token))
        assert status == 503, answer
        assert answer["error"].startswith(f"{job_id}: owner site a unreachable")
        shown = gbroker("status", job_id, "--broker", fleet.urls["b"])
        assert shown.returncode != 0
        assert "owner site a unreachable" in shown.stderr
        assert "Traceback" not in shown.stderr
    finally:
        restarted = gbroker("fleet", "restart", "a", "--dir", str(fleet.directory))
        assert restarted.returncode == 0, restarted.stderr
    fleet.pids["a"] = json.loads((fleet.directory / "fleet.json").read_text())["sites"]["a"]["pid"]


def test_the_fleet_still_serves_after_every_attack(fleet: Fleet) -> None:
    job_id = submit(fleet, "b")
    final = job_status(fleet, job_id, wait=30)
    assert (final["state"], final["exit_code"]) == ("done", 0)
    for url in fleet.urls.values():
        status, health = http("GET", f"{url}/api/v1/health", headers=bearer(fleet.token))
        assert (status, health["ok"]) == (200, True), health
    # The launchers that started all those jobs speak to the broker's user alone.
    launcher_files = list((fleet.directory / "b" / "jobs").glob(".gbroker-launcher*"))
    assert {path.suffix for path in launcher_files} >= {".sock", ".lock", ".log"}
    for path in launcher_files:
        assert path.stat().st_mode & 0o077 == 0, path
