"""examples/jacobi2d.py, the AppLeS paper's Jacobi2D, run as a co-allocated job's components would
run it: one process per rank, each given the rank table in its environment (docs: the rank table
of a co-allocated job), exchanging its border rows with its neighbours over TCP."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import ROOT

PROGRAM = ROOT / "examples" / "jacobi2d.py"


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def start(
    rank: int, table: list[dict[str, object]], *args: str, key: str | None = None
) -> subprocess.Popen[str]:
    env = {**os.environ, "GBROKER_RANK": str(rank), "GBROKER_RANKS": json.dumps(table)}
    if key is not None:
        env["GBROKER_RANKS_KEY"] = key
    return subprocess.Popen(
        [sys.executable, str(PROGRAM), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_three_uneven_ranks_compute_the_serial_grid(tmp_path: Path) -> None:
    ports = free_ports(3)
    # The planner's units (uneven) are each rank's rows; the table names the sites.
    table: list[dict[str, object]] = [
        {"rank": r, "site": s, "host": "127.0.0.1", "port": p, "cores": 1, "units": u}
        for r, (s, p, u) in enumerate(zip("ABC", ports, (17, 60, 43), strict=True))
    ]
    # Each rank may start before the one it connects to listens: it retries.
    processes = {rank: start(rank, table, "--n", "120", "--iterations", "40", "--check")
                 for rank in (0, 1, 2)}  # fmt: skip
    reports = {}
    for rank, process in processes.items():
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, (rank, err)
        reports[rank] = json.loads(out.strip().splitlines()[-1])
    assert [reports[r]["rows"] for r in (0, 1, 2)] == [17, 60, 43]
    assert [reports[r]["site"] for r in (0, 1, 2)] == ["A", "B", "C"]
    assert reports[0]["check"] == "ok", reports[0]
    assert reports[0]["max_difference"] == 0.0
    assert reports[0]["overall_seconds"] > 0
    for report in reports.values():
        assert report["iterations"] == 40
        assert report["compute_seconds"] > 0
        assert report["communication_seconds"] > 0
    # --rows overrides the table's units (and must still cover the grid).
    ports = free_ports(3)
    table = [{"rank": r, "host": "127.0.0.1", "port": p} for r, p in enumerate(ports)]
    args = ("--n", "30", "--iterations", "5", "--rows", "5,5,20", "--check")
    processes = {rank: start(rank, table, *args) for rank in (2, 1, 0)}
    outs = {rank: p.communicate(timeout=120) for rank, p in processes.items()}
    assert all(p.returncode == 0 for p in processes.values()), outs
    assert [json.loads(outs[r][0])["rows"] for r in (0, 1, 2)] == [5, 5, 20]
    assert json.loads(outs[0][0])["check"] == "ok"


def test_a_rank_whose_neighbour_never_comes_says_so_and_fails() -> None:
    ports = free_ports(3)
    table: list[dict[str, object]] = [
        {"rank": r, "host": "127.0.0.1", "port": p} for r, p in enumerate(ports)
    ]
    began = time.monotonic()
    lone = start(1, table, "--n", "30", "--iterations", "5", "--timeout", "2")
    out, err = lone.communicate(timeout=60)
    assert lone.returncode == 1
    assert out == ""
    assert f"rank 1: rank 2 at 127.0.0.1:{ports[2]} never answered" in err
    assert time.monotonic() - began < 30  # its deadline, not forever
    # The last rank waits for rank 1's connection, and says who never came.
    last = start(2, table, "--n", "30", "--iterations", "5", "--timeout", "2")
    out, err = last.communicate(timeout=60)
    assert last.returncode == 1
    assert "rank 2: rank 1 (at 127.0.0.1:" in err
    assert "never connected" in err


def test_a_wrong_rank_table_or_partition_is_one_line() -> None:
    table = [{"rank": 0, "host": "127.0.0.1", "port": 1}, {"rank": 1, "host": "h", "port": 2}]
    bad = start(0, table, "--n", "30", "--iterations", "5", "--rows", "10,10")
    _, err = bad.communicate(timeout=60)
    assert bad.returncode == 1
    assert err.strip() == (
        "jacobi2d: --rows: expected row counts >= 1 summing to --n 30, got [10, 10]"
    )
    env = {**os.environ, "GBROKER_RANK": "0", "GBROKER_RANKS": "[{"}
    broken = subprocess.run(
        [sys.executable, str(PROGRAM), "--n", "4", "--iterations", "1"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert broken.returncode == 1
    assert broken.stderr.startswith("jacobi2d: GBROKER_RANKS: expected a JSON list")
    assert "Traceback" not in broken.stderr


KEY = "ab" * 32


def test_ranks_with_the_jobs_key_refuse_a_program_without_it() -> None:
    """Another user's program that connects to rank 1 as rank 0 is refused (it cannot prove
    the key), and the real rank 0 is taken after it; one that listens on rank 1's port is found
    out by rank 0, which fails saying so, without ever sending the key."""
    ports = free_ports(2)
    table: list[dict[str, object]] = [
        {"rank": r, "host": "127.0.0.1", "port": p} for r, p in enumerate(ports)
    ]
    args = ("--n", "40", "--iterations", "5", "--check", "--timeout", "30")
    one = start(1, table, *args, key=KEY)
    deadline = time.monotonic() + 30
    while True:  # rank 1 listens
        try:
            impostor = socket.create_connection(("127.0.0.1", ports[1]), timeout=5)
            break
        except OSError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    header = (5).to_bytes(8, "big") + (24).to_bytes(8, "big")  # HELLO, rank 0 + a nonce
    impostor.sendall(header + (0).to_bytes(8, "big") + os.urandom(16))
    challenge = impostor.recv(64)  # rank 1's proof and challenge: no key in it
    assert KEY.encode() not in challenge
    assert bytes.fromhex(KEY) not in challenge
    impostor.sendall((6).to_bytes(8, "big") + (32).to_bytes(8, "big") + b"\0" * 32)
    impostor.settimeout(10)
    assert impostor.recv(1) == b""  # refused: closed
    impostor.close()
    zero = start(0, table, *args, key=KEY)
    for process in (zero, one):
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1])["rank"] == 1
    # A program that took rank 1's port: rank 0 finds it does not hold the key.
    squatter = socket.create_server(("127.0.0.1", 0))
    table = [{"rank": 0, "host": "127.0.0.1", "port": free_ports(1)[0]},
             {"rank": 1, "host": "127.0.0.1", "port": squatter.getsockname()[1]}]  # fmt: skip
    zero = start(0, table, *args, key=KEY)
    conn, _ = squatter.accept()
    conn.settimeout(10)
    hello = conn.recv(40)
    assert bytes.fromhex(KEY) not in hello
    conn.sendall((6).to_bytes(8, "big") + (48).to_bytes(8, "big") + os.urandom(48))
    out, err = zero.communicate(timeout=60)
    assert zero.returncode == 1
    assert "does not hold the job's key" in err
    conn.close()
    squatter.close()
