"""`gbroker serve --max-upload SIZE` bounds what a client may upload to the broker's file store
(docs/SECURITY.md), as a real process driven by `gbroker submit --upload`."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from gbroker.fleet.ports import free_port
from gbroker.topology import SiteSpec, Topology, save_topology
from tests.harness import gbroker


def test_an_upload_over_max_upload_is_refused_naming_the_limit(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    topology = tmp_path / "one.yaml"
    save_topology(Topology([SiteSpec("solo", 2, http=url)], (), name="one"), topology)
    serve = subprocess.Popen(
        [sys.executable, "-m", "gbroker", "serve", "--site", "solo", "--topology",
         str(topology), "--data-dir", str(tmp_path / "data"), "--max-upload", "1KiB"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert serve.poll() is None, serve.communicate()[0]
            assert time.monotonic() < deadline, "gbroker serve did not listen"
            time.sleep(0.05)
        job = tmp_path / "job.yaml"
        job.write_text("executable: /bin/cat\narguments: [data.txt]\n")
        small, large = tmp_path / "small" / "data.txt", tmp_path / "large" / "data.txt"
        small.parent.mkdir()
        large.parent.mkdir()
        small.write_bytes(b"x" * 1024)
        large.write_bytes(b"x" * 1025)
        fits = gbroker("submit", str(job), "--upload", str(small), "--broker", url, "--wait")
        assert fits.returncode == 0, fits.stderr
        refused = gbroker("submit", str(job), "--upload", str(large), "--broker", url)
        assert refused.returncode != 0
        assert "413" in refused.stderr, refused.stderr
        assert "larger than the limit of 1024 bytes" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.communicate(timeout=30)
