"""Long commands show a progress bar on stderr when a person watches (a terminal), and nothing
in a pipe: here `gbroker sim` and `gbroker replay`, run as processes under a pseudo-terminal."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SIM = ("sim", "--topology", str(ROOT / "topologies" / "paper-6.yaml"), "--algorithm", "dlo",
       "--rate", "0.3", "--jobs", "300", "--seeds", "2")  # fmt: skip
REPLAY = ("replay", str(ROOT / "tests" / "fixtures" / "quirks.swf"))


def on_terminal(*args: str) -> tuple[int, str, str]:
    """Run gbroker with stderr on a pseudo-terminal; (status, stdout, what the terminal got)."""
    leader, follower = pty.openpty()
    # A terminal of 120 columns, as a person's would say.
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "gbroker", *args],
        stdout=subprocess.PIPE,
        stderr=follower,
        text=True,
    )
    os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 1 << 16)
        except OSError:  # EIO: the other end closed
            break
        if not chunk:
            break
        shown += chunk
    out, _ = proc.communicate(timeout=120)
    os.close(leader)
    return proc.returncode, out, shown.decode(errors="replace")


def test_sim_shows_a_bar_on_a_terminal_and_nothing_in_a_pipe() -> None:
    status, out, shown = on_terminal(*SIM)
    assert status == 0, shown
    assert "throughput B" in out
    assert "sim:" in shown
    assert "600/600" in shown  # counts (jobs x seeds) ...
    assert "job/s" in shown  # ... and the rate
    piped = subprocess.run(
        [sys.executable, "-m", "gbroker", *SIM], capture_output=True, text=True, timeout=120
    )
    assert piped.returncode == 0
    assert piped.stderr == ""
    assert "throughput B" in piped.stdout


def test_replay_shows_a_bar_on_a_terminal() -> None:
    status, out, shown = on_terminal(*REPLAY)
    assert status == 0, shown
    assert "replay:" in shown
    assert "average wait" in out
