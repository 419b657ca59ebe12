#!/usr/bin/env python3
"""Jacobi2D: the AppLeS paper's application, one process per component (rank), over TCP.

The problem: an N x N grid of unknowns inside a fixed boundary, relaxed ``--iterations`` times by
the Jacobi rule (each point becomes the mean of its four neighbours of the previous iteration).
It is decomposed in strips of whole rows: rank r holds rows ``offset .. offset + rows - 1`` and,
every iteration, sends its first row to rank r-1 and its last to rank r+1 and receives theirs
(their "halo" rows), then computes its strip. Nothing else is shared, so a rank's time per
iteration is ``rows x (compute per row)`` plus the exchange of two rows with each neighbour:
the performance model the AppLeS planner partitions the rows by (``gbroker.core.apples``).

Where it runs. As the components of a co-allocated GBroker job, each component finds the job's
rank table in its environment (``GBROKER_RANK``; ``GBROKER_RANKS``, a JSON list of
``{"rank", "site", "host", "port", "cores", "units"}`` in rank order): it listens on its own
``port`` (on every address), connects to rank r+1 at its ``host:port`` and takes rank r-1's
connection. Its rows are its entry's ``units`` when the planner partitioned the job, else equal
strips; ``--rows r0,r1,...`` overrides both. Without a rank table it is one rank of all the rows
(no neighbours): how a site's compute time per row is measured.

The components know one another by the job's key (``GBROKER_RANKS_KEY``, which only the job's
own components are given): a rank that connects and the one that accepts each prove they hold
it (HMAC-SHA256 of the other's challenge), never sending it, so a program of another user that
connects to a rank, or took a rank's port first, is refused. Without the key (a rank table
written by hand) ranks trust whoever says its rank.

Ranks start at slightly different times: a rank retries connecting to its neighbour, and waits
for the other one, ``--timeout`` seconds at most (default 60), then says which neighbour never
came and exits 1. Every message is a 16-byte header (a tag, the payload's length in bytes) and
float64 rows.

At the end each rank prints one JSON line: its rank, rows, the seconds it spent computing (wall
and CPU time; per row and iteration too) and communicating (waiting for a slower neighbour counts
as communication) and its wall time; rank 0
adds the overall time, from the start barrier (every rank connected) to the end barrier (every
rank done). ``--check``: rank 0 gathers the grid and compares it with a serial Jacobi of the same
problem in this process, and exits 1 if they differ.

It needs numpy, in the Python the site runs ``python3`` with.
"""

from __future__ import annotations

import argparse
import hmac
import json
import os
import socket
import struct
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

try:
    import numpy as np
except ImportError as exc:  # a site whose python3 has no numpy: said plainly, not a traceback
    print(f"jacobi2d: numpy is not importable by {sys.executable}: {exc}", file=sys.stderr)
    raise SystemExit(2) from None

HEADER = struct.Struct("!QQ")  # tag, payload bytes
HALO, BARRIER, RELEASE, GATHER, HELLO, PROOF = 1, 2, 3, 4, 5, 6
NONCE = 16


class Failure(Exception):
    """The run cannot go on: the message says why (printed as one line, exit status 1)."""


@dataclass(frozen=True)
class Peer:
    rank: int
    host: str
    port: int


# --- the problem ---------------------------------------------------------------------------------


def initial_rows(first: int, rows: int, n: int) -> np.ndarray:
    """Rows ``first .. first + rows - 1`` of the initial grid with their halo rows and boundary
    columns: shape (rows + 2, n + 2). Every value is a function of its global position only, so
    that any decomposition starts from the same grid (uneven, so that a misplaced row shows)."""
    i = np.arange(first - 1, first + rows + 1, dtype=np.float64)[:, None]  # global row, -1 .. n
    j = np.arange(-1, n + 1, dtype=np.float64)[None, :]
    grid = ((i * 31.0 + j * 17.0) % 97.0) / 97.0
    grid[:, 0] = 1.0  # the fixed boundary: left 1, right 0, top 0.5, bottom 0.25
    grid[:, -1] = 0.0
    if first == 0:
        grid[0, :] = 0.5
    if first + rows == n:
        grid[-1, :] = 0.25
    return grid


def relax(old: np.ndarray, new: np.ndarray) -> None:
    """One Jacobi step of ``old``'s interior into ``new`` (halos and boundary untouched)."""
    inner = new[1:-1, 1:-1]
    np.add(old[:-2, 1:-1], old[2:, 1:-1], out=inner)
    inner += old[1:-1, :-2]
    inner += old[1:-1, 2:]
    inner *= 0.25


def serial(n: int, iterations: int) -> np.ndarray:
    """The whole grid's interior after ``iterations`` steps, in one process."""
    old = initial_rows(0, n, n)
    new = old.copy()
    for _ in range(iterations):
        relax(old, new)
        old, new = new, old
    return old[1:-1, 1:-1]


# --- the rank table ------------------------------------------------------------------------------


def rank_table(environ: dict[str, str]) -> tuple[int, list[dict[str, Any]]]:
    """(this rank, the table) from ``GBROKER_RANK`` and ``GBROKER_RANKS``; one rank, no table
    entries, when neither is set."""
    raw_rank, raw_table = environ.get("GBROKER_RANK"), environ.get("GBROKER_RANKS")
    if raw_rank is None and raw_table is None:
        return 0, []
    if raw_rank is None or raw_table is None:
        raise Failure("GBROKER_RANK and GBROKER_RANKS must be set together")
    try:
        table = json.loads(raw_table)
    except ValueError as exc:
        raise Failure(
            f"GBROKER_RANKS: expected a JSON list, got {raw_table[:80]!r}: {exc}"
        ) from None
    if not isinstance(table, list) or not table or not all(isinstance(e, dict) for e in table):
        raise Failure("GBROKER_RANKS: expected a non-empty JSON list of objects, one per rank")
    for index, entry in enumerate(table):
        if entry.get("rank") != index:
            raise Failure(
                f"GBROKER_RANKS[{index}].rank: expected {index}, got {entry.get('rank')!r}"
            )
        if not isinstance(entry.get("host"), str) or not isinstance(entry.get("port"), int):
            raise Failure(f"GBROKER_RANKS[{index}]: expected a host (text) and a port (integer)")
    if not raw_rank.isdigit() or int(raw_rank) >= len(table):
        raise Failure(f"GBROKER_RANK: expected a rank 0 .. {len(table) - 1}, got {raw_rank!r}")
    return int(raw_rank), table


def strips(n: int, ranks: int, table: list[dict[str, Any]], given: str | None) -> list[int]:
    """Rows per rank: ``--rows``, else the table's ``units`` (when every entry has them), else
    equal strips (the first ones a row more where ``ranks`` does not divide ``n``)."""
    if given is not None:
        try:
            rows = [int(part) for part in given.split(",")]
        except ValueError:
            raise Failure(f"--rows: expected integers separated by commas, got {given!r}") from None
        where = "--rows"
    elif table and all("units" in entry for entry in table):
        rows = [entry["units"] for entry in table]
        where = "GBROKER_RANKS units"
    else:
        share, extra = divmod(n, ranks)
        rows = [share + (1 if r < extra else 0) for r in range(ranks)]
        where = "equal strips"
    if len(rows) != ranks:
        raise Failure(f"{where}: expected {ranks} row counts (one per rank), got {len(rows)}")
    if not all(isinstance(r, int) and r >= 1 for r in rows) or sum(rows) != n:
        raise Failure(f"{where}: expected row counts >= 1 summing to --n {n}, got {rows}")
    return rows


# --- messages between neighbours ----------------------------------------------------------------


def send(sock: socket.socket, tag: int, payload: bytes = b"") -> None:
    sock.sendall(HEADER.pack(tag, len(payload)) + payload)


def receive_exactly(sock: socket.socket, size: int, who: str) -> bytes:
    buffer = bytearray(size)
    view, got = memoryview(buffer), 0
    while got < size:
        try:
            count = sock.recv_into(view[got:])
        except TimeoutError:
            raise Failure(f"{who} sent nothing for {sock.gettimeout():.0f} s") from None
        if count == 0:
            raise Failure(f"{who} closed its connection (it failed or ended early)")
        got += count
    return bytes(buffer)


def receive(sock: socket.socket, tag: int, who: str, size: int | None = None) -> bytes:
    got_tag, length = HEADER.unpack(receive_exactly(sock, HEADER.size, who))
    if got_tag != tag or (size is not None and length != size):
        raise Failure(f"{who} sent message {got_tag} of {length} bytes, expected {tag} ({size})")
    return receive_exactly(sock, length, who) if length else b""


def proof(key: bytes, side: bytes, first: bytes, second: bytes, rank: int) -> bytes:
    """What a rank that holds the job's key answers to a challenge (HMAC-SHA256)."""
    return hmac.new(key, side + first + second + struct.pack("!Q", rank), "sha256").digest()


def connect(me: int, peer: Peer, deadline: float, key: bytes | None) -> socket.socket:
    """A connection to ``peer`` (which listens), retried until ``deadline``. With the job's
    ``key``, each side proves it holds the key without sending it: a program of another user
    that took ``peer``'s port learns nothing and is refused."""
    last: OSError | None = None
    while time.monotonic() < deadline:
        try:
            sock = socket.create_connection((peer.host, peer.port), timeout=2.0)
        except OSError as exc:
            last = exc
            time.sleep(0.05)
            continue
        mine = os.urandom(NONCE)
        who = f"rank {peer.rank} at {peer.host}:{peer.port}"
        try:
            send(sock, HELLO, struct.pack("!Q", me) + mine)
            answer = receive(sock, PROOF, who, 32 + NONCE) if key is not None else b""
        except OSError as exc:  # it went away, or never answers: try again
            sock.close()
            last = exc
            time.sleep(0.05)
            continue
        if key is not None:
            theirs = answer[32:]
            if not hmac.compare_digest(answer[:32], proof(key, b"L", mine, theirs, peer.rank)):
                sock.close()
                raise Failure(f"rank {me}: {who} does not hold the job's key: not one of its ranks")
            send(sock, PROOF, proof(key, b"C", theirs, mine, me))
        return sock
    raise Failure(
        f"rank {me}: rank {peer.rank} at {peer.host}:{peer.port} never answered ({last}); "
        "it did not start, or cannot be reached"
    )


def accept(
    me: int, listener: socket.socket, peer: Peer, deadline: float, key: bytes | None
) -> socket.socket:
    """Rank ``peer``'s connection, waited for until ``deadline`` (with the job's ``key``, one
    that proves it holds it; any other is closed, and the wait goes on)."""
    while True:
        listener.settimeout(max(0.0, deadline - time.monotonic()))
        try:
            sock, _ = listener.accept()
        except TimeoutError:
            raise Failure(
                f"rank {me}: rank {peer.rank} (at {peer.host}:{peer.port}) never connected "
                "within the deadline; it did not start, or cannot reach this rank"
            ) from None
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            hello = receive(sock, HELLO, f"a connection to rank {me}", 8 + NONCE)
            if struct.unpack("!Q", hello[:8])[0] != peer.rank:
                raise Failure("another rank")
            if key is not None:
                theirs, mine = hello[8:], os.urandom(NONCE)
                send(sock, PROOF, proof(key, b"L", theirs, mine, me) + mine)
                answer = receive(sock, PROOF, f"a connection to rank {me}", 32)
                if not hmac.compare_digest(answer, proof(key, b"C", mine, theirs, peer.rank)):
                    raise Failure("no proof of the job's key")
        except (Failure, OSError):
            sock.close()  # not one of ours (a probe, another user's program): wait on
            continue
        return sock


# --- the run -------------------------------------------------------------------------------------


class Rank:
    """This rank's strip and its connections to rank - 1 (``up``) and rank + 1 (``down``)."""

    def __init__(self, rank: int, rows: list[int], n: int) -> None:
        self.rank, self.rows, self.n = rank, rows, n
        self.first = sum(rows[:rank])
        self.old = initial_rows(self.first, rows[rank], n)
        self.new = self.old.copy()
        self.up: socket.socket | None = None
        self.down: socket.socket | None = None
        self.pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="send")

    def exchange(self) -> None:
        """Send the first and last rows, receive the halo rows (sends in threads: two ranks that
        both send a row larger than the sockets' buffers would otherwise wait for each other)."""
        row_bytes = self.n * 8
        sends = []
        if self.up is not None:
            sends.append(self.pool.submit(send, self.up, HALO, self.old[1, 1:-1].tobytes()))
        if self.down is not None:
            sends.append(self.pool.submit(send, self.down, HALO, self.old[-2, 1:-1].tobytes()))
        if self.up is not None:
            got = receive(self.up, HALO, f"rank {self.rank - 1}", row_bytes)
            self.old[0, 1:-1] = np.frombuffer(got, dtype=np.float64)
        if self.down is not None:
            got = receive(self.down, HALO, f"rank {self.rank + 1}", row_bytes)
            self.old[-1, 1:-1] = np.frombuffer(got, dtype=np.float64)
        for sent in sends:
            sent.result()

    def barrier(self) -> None:
        """Every rank reaches it before any leaves: a word up the chain to rank 0, and back."""
        if self.down is not None:
            receive(self.down, BARRIER, f"rank {self.rank + 1}")
        if self.up is not None:
            send(self.up, BARRIER)
            receive(self.up, RELEASE, f"rank {self.rank - 1}")
        if self.down is not None:
            send(self.down, RELEASE)

    def gather(self) -> np.ndarray | None:
        """The whole interior at rank 0 (each rank passes up its strip and those below it)."""
        mine = self.old[1:-1, 1:-1]
        if self.down is not None:
            below = receive(self.down, GATHER, f"rank {self.rank + 1}")
            rows = np.frombuffer(below, dtype=np.float64).reshape(-1, self.n)
            mine = np.concatenate([mine, rows])
        if self.up is not None:
            send(self.up, GATHER, np.ascontiguousarray(mine).tobytes())
            return None
        return mine

    def close(self) -> None:
        self.pool.shutdown()
        for sock in (self.up, self.down):
            if sock is not None:
                sock.close()


def run(args: argparse.Namespace, environ: dict[str, str]) -> int:
    me, table = rank_table(environ)
    ranks = max(1, len(table))
    rows = strips(args.n, ranks, table, args.rows)
    peers = [Peer(e["rank"], e["host"], e["port"]) for e in table]
    began = time.perf_counter()
    rank = Rank(me, rows, args.n)
    deadline = time.monotonic() + args.timeout
    listener = None
    try:
        if ranks > 1:
            listener = socket.create_server(("0.0.0.0", peers[me].port), reuse_port=False)
            key = environ.get("GBROKER_RANKS_KEY")
            secret = bytes.fromhex(key) if key else None
            if me + 1 < ranks:  # it listens already: our connect completes whenever it accepts
                rank.down = connect(me, peers[me + 1], deadline, secret)
            if me > 0:
                rank.up = accept(me, listener, peers[me - 1], deadline, secret)
            for sock in (rank.up, rank.down):
                if sock is not None:
                    sock.settimeout(args.timeout)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rank.barrier()
        start = time.perf_counter()
        compute = communicate = compute_cpu = 0.0
        for _ in range(args.iterations):
            t0 = time.perf_counter()
            rank.exchange()
            t1, c1 = time.perf_counter(), time.thread_time()
            relax(rank.old, rank.new)
            rank.old, rank.new = rank.new, rank.old
            # CPU time first: reading it is a system call, where the kernel may find the
            # cgroup's CPU quota spent and stop the rank till the next period, a wait that
            # belongs to this window (read after the wall clock, it fell outside every window).
            c2 = time.thread_time()
            t2 = time.perf_counter()
            communicate += t1 - t0
            compute += t2 - t1
            compute_cpu += c2 - c1
        rank.barrier()
        overall = time.perf_counter() - start
        report: dict[str, Any] = {
            "rank": me,
            "site": table[me].get("site") if table else environ.get("GBROKER_SITE"),
            "n": args.n,
            "iterations": args.iterations,
            "rows": rows[me],
            "compute_seconds": round(compute, 6),
            "communication_seconds": round(communicate, 6),
            # The kernel's wall time per row and iteration here, and its CPU time (the planner's
            # ``compute``: what it costs at a share of 1, whatever this site's share and load).
            "seconds_per_row_iteration": compute / max(1, rows[me] * args.iterations),
            "cpu_seconds_per_row_iteration": compute_cpu / max(1, rows[me] * args.iterations),
            "compute_cpu_seconds": round(compute_cpu, 6),
        }
        status = 0
        if args.check:
            grid = rank.gather()
            if grid is not None:
                expected = serial(args.n, args.iterations)
                difference = float(np.max(np.abs(grid - expected)))
                report["check"] = "ok" if difference <= 1e-12 else "MISMATCH"
                report["max_difference"] = difference
                status = 0 if difference <= 1e-12 else 1
        if me == 0:
            report["overall_seconds"] = round(overall, 6)
        report["wall_seconds"] = round(time.perf_counter() - began, 6)
        print(json.dumps(report), flush=True)
        return status
    finally:
        rank.close()
        if listener is not None:
            listener.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, required=True, help="the grid is N x N")
    parser.add_argument("--iterations", type=int, required=True, help="Jacobi steps")
    parser.add_argument("--rows", help="rows per rank, r0,r1,... (overrides the rank table)")
    parser.add_argument("--check", action="store_true", help="compare with a serial Jacobi")
    parser.add_argument(
        "--timeout", type=float, default=60.0, help="seconds to wait for a neighbour (60)"
    )
    args = parser.parse_args(argv)
    if args.n < 1:
        parser.error(f"--n: expected an integer >= 1, got {args.n}")
    if args.iterations < 0:
        parser.error(f"--iterations: expected an integer >= 0, got {args.iterations}")
    if not args.timeout > 0:
        parser.error(f"--timeout: expected seconds > 0, got {args.timeout}")
    try:
        return run(args, dict(os.environ))
    except Failure as exc:
        print(f"jacobi2d: {exc}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
