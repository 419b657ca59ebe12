"""TLS between real broker processes: HTTPS for clients and peers, mqtts, one fleet CA.

The certificates are pure values (first tests). Then a pair of ``gbroker serve`` processes with
an ``mqtts://`` embedded MQTT broker process, all from certificates of one fleet CA, runs a job
end to end (submitted at a, staged and run at b); clients and peers that do not speak TLS, that
verify against another CA or that present another CA's certificate are refused. Last, ``gbroker
fleet up --tls`` comes up and serves a job.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from cryptography import x509

from gbroker.client import fleetdir
from gbroker.client.gclient import BrokerUnreachable, BrokerUntrusted, Client
from gbroker.errors import InvalidInput
from gbroker.fleet.ports import free_port
from gbroker.mqtt.accounts import write_auth_files
from gbroker.mqtt.broker import EmbeddedBroker
from gbroker.mqtt.link import LinkError, SiteLink
from gbroker.security import tls
from gbroker.security.auth import Tokens
from gbroker.topology import load_topology
from tests.harness import gbroker

# Too big for a (2 cores): it runs at b, staged there from a's file store.
JOB = (
    "executable: /bin/sh\n"
    'arguments: ["-c", "echo $GBROKER_SITE; wc -c < input.dat"]\n'
    "total_cpu_count: {exact: 4}\n"
)


# --- certificates ------------------------------------------------------------------------------


def _sans(path: Path) -> list[str]:
    certificate = x509.load_pem_x509_certificate(path.read_bytes())
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return [str(n.value) for n in names]


def test_site_certificates_cover_their_url_host_and_localhost(tmp_path: Path) -> None:
    issued = tls.fleet_certificates(
        tmp_path,
        {"a": ["https://10.1.2.3:8701"], "b": ["https://node-b.example.org:8701", "mqtts://[::1]"]},
    )
    assert _sans(issued["a"].cert) == ["10.1.2.3", "localhost"]
    assert _sans(issued["b"].cert) == ["node-b.example.org", "::1", "localhost"]
    for key in (tmp_path / "ca.key", issued["a"].key, issued["b"].key):
        assert key.stat().st_mode & 0o777 == 0o600
    ca = (tmp_path / "ca.crt").read_bytes()
    again = tls.fleet_certificates(tmp_path, {"a": ["https://10.1.2.3:8701"]})
    assert (tmp_path / "ca.crt").read_bytes() == ca  # the CA is kept, clients go on trusting it
    assert again["a"].ca == issued["a"].ca


def test_contexts_verify_hosts_and_refuse_old_protocols(tmp_path: Path) -> None:
    files = tls.fleet_certificates(tmp_path, {"a": ["https://127.0.0.1:1"]})["a"]
    server, client = tls.daemon_contexts(files.cert, files.key, files.ca)
    assert server is not None
    assert client is not None
    assert server.minimum_version == client.minimum_version == ssl.TLSVersion.TLSv1_2
    assert server.verify_mode == ssl.CERT_OPTIONAL  # clients need no certificate; peers' verify
    assert client.check_hostname
    assert client.verify_mode == ssl.CERT_REQUIRED
    assert tls.daemon_contexts(None, None, None) == (None, None)
    with pytest.raises(InvalidInput, match="tls_key"):
        tls.daemon_contexts(files.cert, None, files.ca)
    with pytest.raises(InvalidInput, match="tls_ca"):
        tls.client_context(tmp_path / "missing.crt")
    with pytest.raises(InvalidInput, match="tls_cert"):
        tls.server_context(files.ca, files.key)  # the CA's certificate does not match a's key


def test_a_broker_serves_as_its_topology_endpoint_says(tmp_path: Path) -> None:
    tls.check_endpoint("a", "https://h:1", serving_tls=True)
    tls.check_endpoint("a", "http://h:1", serving_tls=False)
    tls.check_endpoint("a", None, serving_tls=True)
    with pytest.raises(InvalidInput, match=r"site\[a\]\.http"):
        tls.check_endpoint("a", "http://h:1", serving_tls=True)
    with pytest.raises(InvalidInput, match="tls_cert"):
        tls.check_endpoint("a", "https://h:1", serving_tls=False)
    topology = tmp_path / "t.yaml"
    topology.write_text("name: t\nneighbourhood: full\nsites:\n  - {name: a, cores: 1}\n")
    files = tls.fleet_certificates(tmp_path, {"a": ["https://127.0.0.1:1"]})["a"]
    refused = gbroker(
        *("serve", "--site", "a", "--topology", str(topology), "--data-dir", str(tmp_path / "a")),
        *("--tls-cert", str(files.cert)),
    )
    assert refused.returncode == 2
    assert "tls_key" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_a_client_finds_its_ca_by_flag_then_environment_then_fleet_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GBROKER_CA", raising=False)
    monkeypatch.setenv("GBROKER_FLEET", str(tmp_path / "fleet"))
    assert fleetdir.find_ca() is None  # no fleet there: the system's CAs
    tls.create_ca(tmp_path / "fleet" / "tls")
    assert fleetdir.find_ca() is None  # a CA, but no fleet runs there (no fleet.json)
    (tmp_path / "fleet" / "fleet.json").write_text("{}")
    assert fleetdir.find_ca() == str(tmp_path / "fleet" / "tls" / "ca.crt")
    monkeypatch.setenv("GBROKER_CA", "/env/ca.crt")
    assert fleetdir.find_ca() == "/env/ca.crt"
    assert fleetdir.find_ca("/flag/ca.crt") == "/flag/ca.crt"


def test_the_topology_loader_takes_https_and_mqtts_endpoints(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(
        "name: t\nneighbourhood: full\nsites:\n"
        "  - {name: a, cores: 2, http: 'https://a.example:8701', mqtt: 'mqtts://mq.example'}\n"
    )
    site = load_topology(path).sites["a"]
    assert (site.http, site.mqtt) == ("https://a.example:8701", "mqtts://mq.example")


@pytest.mark.asyncio
async def test_an_mqtts_link_trusts_only_a_broker_of_the_fleet_ca(tmp_path: Path) -> None:
    issued = tls.fleet_certificates(tmp_path / "fleet", {"mqtt": ["mqtts://127.0.0.1"]})["mqtt"]
    other = tls.create_ca(tmp_path / "other")
    async with EmbeddedBroker(ssl_context=tls.server_context(issued.cert, issued.key)) as broker:
        assert broker.url.startswith("mqtts://")
        async with SiteLink(broker.url, "a", tls_context=tls.client_context(issued.ca)):
            pass
        with pytest.raises(LinkError):
            async with SiteLink(broker.url, "a", tls_context=tls.client_context(other.cert)):
                pass
        with pytest.raises(LinkError):  # the system's CAs do not know the fleet's
            async with SiteLink(broker.url, "a", timeout=2.0):
                pass


# --- a TLS pair of broker processes ------------------------------------------------------------


def _wait_listening(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    import socket

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"exited during start-up: {log.read_text(errors='replace')}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"not listening on {port}: {log.read_text(errors='replace')}")


class Pair:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.ports = {"a": free_port(), "b": free_port()}
        self.urls = {site: f"https://127.0.0.1:{port}" for site, port in self.ports.items()}
        endpoints: dict[str, list[str]] = {site: [url] for site, url in self.urls.items()}
        endpoints["mqtt"] = ["mqtts://127.0.0.1"]
        self.files = tls.fleet_certificates(root / "tls", endpoints)
        self.ca = self.files["a"].ca
        self.other = tls.fleet_certificates(root / "other", {"a": [self.urls["a"]]})["a"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    """Sites a (2 cores) and b (8), HTTPS, and an mqtts embedded MQTT broker: three processes."""
    root = tmp_path_factory.mktemp("tls-pair")
    fleet = Pair(root)
    topology = root / "pair.yaml"
    topology.write_text(
        "name: pair\nneighbourhood: full\nsites:\n"
        + "".join(
            f"  - {{name: {site}, cores: {cores}, http: '{fleet.urls[site]}'}}\n"
            for site, cores in (("a", 2), ("b", 8))
        )
    )
    mqtt_port = free_port()
    mqtt = fleet.files["mqtt"]
    auth = write_auth_files(root / "mqtt", ["a", "b"])
    (root / "secret").write_text("tls-pair-fleet-secret")
    Tokens.create(root / "tokens")
    commands = {
        "mqtt": [
            *("mqtt-serve", "--port", str(mqtt_port)),
            *("--password-file", str(auth.amqtt_passwords), "--acl-file", str(auth.acl)),
            *("--tls-cert", str(mqtt.cert), "--tls-key", str(mqtt.key)),
        ]
    }
    for site in ("a", "b"):
        own = fleet.files[site]
        commands[site] = [
            *("serve", "--site", site, "--topology", str(topology)),
            *("--data-dir", str(root / site), "--mqtt", f"mqtts://127.0.0.1:{mqtt_port}"),
            *("--mqtt-password-file", str(auth.password_file(site))),
            *("--secret-file", str(root / "secret"), "--token-file", str(root / "tokens")),
            *("--tls-cert", str(own.cert), "--tls-key", str(own.key), "--tls-ca", str(own.ca)),
            "--stop-jobs-on-exit",
        ]
    processes: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name, args in commands.items():
            with (root / f"{name}.log").open("wb") as log:
                processes[name] = subprocess.Popen(
                    [sys.executable, "-m", "gbroker", *args], stdout=log, stderr=subprocess.STDOUT
                )
        ports = {"mqtt": mqtt_port, **fleet.ports}
        for name, process in processes.items():
            _wait_listening(ports[name], process, root / f"{name}.log")
        yield fleet
    finally:  # the brokers first, then the MQTT broker they say offline through
        brokers = [p for name, p in processes.items() if name != "mqtt"]
        _stop(brokers)
        _stop([processes["mqtt"]] if "mqtt" in processes else [])
    for site in ("a", "b"):  # the mqtts link held all along, NetMon's probes got through
        text = (root / f"{site}.log").read_text()
        assert "MQTT link" not in text, text
        assert "probe" not in text, text


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_a_job_submitted_at_one_broker_is_staged_and_run_at_the_other_over_https(
    pair: Pair, tmp_path: Path
) -> None:
    data = tmp_path / "input.dat"
    data.write_bytes(b"x" * 100_000)

    async def run() -> tuple[dict[str, object], bytes]:
        async with Client(pair.urls["a"], ca=pair.ca) as client:
            job_id = await client.submit_with_files(JOB.encode(), [data])
            status = await client.wait(job_id, timeout=20)
            return status, await client.output(job_id)

    status, output = asyncio.run(run())
    assert (status["state"], status["site"]) == ("done", "b"), status
    assert output.split() == [b"b", b"100000"]
    info = gbroker(
        "jobs", "--broker", pair.urls["b"], env={**os.environ, "GBROKER_CA": str(pair.ca)}
    )
    assert info.returncode == 0, info.stderr


def test_neighbours_hear_each_other_over_mqtts(pair: Pair) -> None:
    async def reported() -> dict[str, object]:
        async with Client(pair.urls["a"], ca=pair.ca) as client, asyncio.timeout(15):
            while True:
                info = await client.info()
                assert info["url"] == pair.urls["a"]  # the advertised URL is https://
                (b,) = info["neighbours"]
                if b["status"] == "reported":  # DCSMon's state of b, through the mqtts broker
                    return dict(b)
                await asyncio.sleep(0.1)

    assert asyncio.run(reported())["site"] == "b"


def test_a_plain_http_client_is_refused_cleanly(pair: Pair) -> None:
    plain = pair.urls["a"].replace("https://", "http://")

    async def run() -> None:
        async with Client(plain) as client:
            await client.jobs()

    with pytest.raises(BrokerUnreachable, match="https"):
        asyncio.run(run())
    refused = gbroker("jobs", "--broker", plain)
    assert refused.returncode == 4  # no broker answered (gbroker.cli.exits)
    assert "an https:// broker?" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_clients_verifying_against_another_ca_are_refused(pair: Pair) -> None:
    async def run(ca: Path | None) -> None:
        async with Client(pair.urls["a"], ca=ca) as client:
            await client.jobs()

    for ca in (pair.other.ca, None):  # another fleet's CA; the system's CAs
        with pytest.raises(BrokerUntrusted, match="certificate"):
            asyncio.run(run(ca))
    env = {k: v for k, v in os.environ.items() if k not in ("GBROKER_CA", "GBROKER_FLEET")}
    refused = gbroker("jobs", "--broker", pair.urls["b"], "--ca", str(pair.other.ca), env=env)
    assert refused.returncode == 2
    assert "does not verify" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_a_peer_presenting_another_cas_certificate_is_refused(pair: Pair) -> None:
    """What a broker's peer session does (gbroker.security.tls.daemon_contexts): with a certificate
    of the fleet CA the handshake completes; with another CA's, the broker refuses it."""

    async def status(cert: Path, key: Path) -> int:
        context = tls.client_context(pair.ca, cert, key)
        connector = aiohttp.TCPConnector(ssl=context)
        async with (
            aiohttp.ClientSession(connector=connector) as http,
            http.post(f"{pair.urls['a']}/peer/v1/probe", data=b"x") as response,
        ):
            return response.status

    member = pair.files["b"]
    assert asyncio.run(status(member.cert, member.key)) < 500  # answered (the guard decides)
    with pytest.raises(aiohttp.ClientError):
        asyncio.run(status(pair.other.cert, pair.other.key))


# --- gbroker fleet up --tls --------------------------------------------------------------------


def test_fleet_up_with_tls_serves_a_job_over_https(tmp_path: Path) -> None:
    topology = tmp_path / "pair.yaml"
    topology.write_text(
        "name: pair\nneighbourhood: full\nsites:\n"
        "  - {name: a, cores: 2}\n"
        "  - {name: b, cores: 8}\n"
    )
    directory = tmp_path / "fleet"
    started = gbroker("fleet", "up", "--tls", "--topology", str(topology), "--dir", str(directory))
    assert started.returncode == 0, started.stderr
    try:
        record = json.loads((directory / "fleet.json").read_text())
        assert record["mqtt_url"].startswith("mqtts://")
        urls = {name: m["url"] for name, m in record["sites"].items()}
        assert all(url.startswith("https://") for url in urls.values())
        assert {s.http for s in load_topology(directory / "topology.yaml").sites.values()} == set(
            urls.values()
        )
        assert (directory / "tls" / "site-a.key").stat().st_mode & 0o777 == 0o600
        status = gbroker("fleet", "status", "--dir", str(directory))
        assert status.returncode == 0, status.stdout
        assert "DOWN" not in status.stdout, status.stdout

        job = tmp_path / "job.yaml"
        job.write_text("executable: /bin/echo\narguments: [hi]\ntotal_cpu_count: {exact: 4}\n")
        # The client finds the fleet's CA through the fleet directory.
        env = {k: v for k, v in os.environ.items() if k != "GBROKER_CA"}
        env["GBROKER_FLEET"] = str(directory)
        done = gbroker("submit", "--wait", "--json", "--broker", urls["a"], str(job), env=env)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)[0]["site"] == "b"
    finally:
        stopped = gbroker("fleet", "down", "--dir", str(directory))
        assert stopped.returncode == 0, stopped.stderr
