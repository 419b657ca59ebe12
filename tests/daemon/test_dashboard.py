"""The fleet dashboard (`/fleet`), against a real fleet of broker processes: its sign-in and
session rules over plain HTTP, then the page itself in a real headless Chromium (Debian's,
driven by Playwright), which must show every site, a job as it is submitted, its story with the
F(j) terms of its decision, and a killed broker as down. A screenshot is kept in
``out/screenshots/`` (or ``$GBROKER_ARTIFACTS``): CI's artifact. Chromium is required: the test
fails (never skips) without it, since CI installs it with ``scripts/ensure_chromium.sh``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gbroker.security.auth import Tokens
from gbroker.topology import SiteSpec, Topology, save_topology

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
# As the machine's notes say Chromium runs headless here (no network but loopback).
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
BIG_JOB = "name: big\nexecutable: /bin/sleep\narguments: ['2']\ntotal_cpu_count: {exact: 8}\n"


def gbroker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gbroker", *args], capture_output=True, text=True, timeout=120
    )


@dataclass
class Fleet:
    directory: Path
    urls: dict[str, str]
    token: str


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    topology = tmp_path / "three.yaml"
    sites = [SiteSpec("a", 2), SiteSpec("b", 2), SiteSpec("c", 8)]
    save_topology(Topology(sites, "full", name="three"), topology)
    directory = tmp_path / "fleet"
    started = gbroker("fleet", "up", "--topology", str(topology), "--dir", str(directory))
    assert started.returncode == 0, started.stderr
    record = json.loads((directory / "fleet.json").read_text())
    token = Tokens.load(directory / "tokens").first_token()
    try:
        yield Fleet(directory, {n: m["url"] for n, m in record["sites"].items()}, token)
    finally:
        stopped = gbroker("fleet", "down", "--dir", str(directory))
        assert stopped.returncode == 0, stopped.stderr


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def call(
    url: str, data: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, data=data, headers=headers or {})
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def login(url: str, token: str, origin: str | None = None) -> tuple[int, dict[str, str], bytes]:
    form = urllib.parse.urlencode({"token": token}).encode()
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    if origin:
        headers["Origin"] = origin
    return call(f"{url}/fleet/login", form, headers)


def test_the_dashboard_needs_the_token_and_a_session_opens_reads_only(fleet: Fleet) -> None:
    url = fleet.urls["a"]
    status, _, page = call(f"{url}/fleet")
    assert status == 401
    assert b'name="token"' in page  # the sign-in form, and nothing of the fleet
    assert b"dashboard.js" not in page
    for path in ("/api/v1/fleet", "/fleet/static/dashboard.js", "/api/v1/decisions"):
        assert call(url + path)[0] == 401, path
    assert login(url, "not-the-token-0123456789")[0] == 401
    assert login(url, fleet.token, origin="http://evil.example")[0] == 403
    status, headers, _ = login(url, fleet.token)
    assert status == 303
    cookie = headers["Set-Cookie"]
    assert "HttpOnly" in cookie
    assert "SameSite=Strict" in cookie
    assert fleet.token not in cookie  # a random session id, not the token
    session = {"Cookie": cookie.split(";", 1)[0]}
    status, headers, page = call(f"{url}/fleet", headers=session)
    assert status == 200
    assert b"dashboard.js" in page
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    status, _, body = call(f"{url}/api/v1/fleet", headers=session)
    assert status == 200
    facts = json.loads(body)
    assert [s["name"] for s in facts["sites"]] == ["a", "b", "c"]
    assert all(s["alive"] for s in facts["sites"])
    # The cookie opens reads only: a submission with it alone is refused.
    job = b"executable: /bin/true\n"
    assert call(f"{url}/api/v1/jobs", job, session)[0] == 401
    # Another broker does not know this session.
    assert call(f"{fleet.urls['b']}/api/v1/fleet", headers=session)[0] == 401


def screenshot_path() -> Path:
    directory = Path(os.environ.get("GBROKER_ARTIFACTS", ROOT / "out" / "screenshots"))
    directory.mkdir(parents=True, exist_ok=True)
    return directory / "fleet-dashboard.png"


def test_the_dashboard_in_a_real_browser(fleet: Fleet, tmp_path: Path) -> None:
    if not CHROMIUM.exists():
        pytest.fail(
            "Chromium is not installed and the dashboard test needs it: run "
            "`bash scripts/ensure_chromium.sh`",
            pytrace=False,
        )
    from playwright.sync_api import expect, sync_playwright

    url = fleet.urls["a"]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1100})
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(f"{url}/fleet")
            page.fill("#token", fleet.token)
            page.click("button[type=submit]")
            # Every site, up, in the graph and in the table.
            for site in ("a", "b", "c"):
                expect(page.locator(f'#graph g.site[data-site="{site}"]')).to_have_attribute(
                    "data-alive", "true", timeout=15_000
                )
                expect(page.locator(f'#sites tr[data-site="{site}"]')).to_be_visible()
            # A job submitted now shows up; only c has 8 cores, so it moves from a to c.
            job = tmp_path / "big.yaml"
            job.write_text(BIG_JOB)
            submitted = gbroker("submit", str(job), "--broker", url, "--token-file",
                                str(fleet.directory / "tokens"))  # fmt: skip
            assert submitted.returncode == 0, submitted.stderr
            job_id = submitted.stdout.strip()
            row = page.locator(f'#jobs tr[data-job="{job_id}"]')
            expect(row).to_be_visible(timeout=15_000)
            expect(page.locator(f'#graph line.move[data-job="{job_id}"]')).to_have_count(1)
            # Its story: the history from its owner, and the F(j) terms of the decision.
            row.click()
            expect(page.locator("#story-job")).to_have_text(job_id)
            expect(page.locator("#story table.history")).to_be_visible(timeout=10_000)
            chosen = page.locator('#story table.terms tr.chosen[data-site="c"]')
            expect(chosen).to_be_visible(timeout=10_000)
            expect(page.locator("#story")).to_contain_text("ran at c")
            # The plots are drawn (uPlot makes a canvas per plot).
            expect(page.locator("#plots-panel canvas")).to_have_count(3)
            # A killed broker shows as down.
            killed = gbroker("fleet", "kill", "b", "--dir", str(fleet.directory))
            assert killed.returncode == 0, killed.stderr
            expect(page.locator('#graph g.site[data-site="b"]')).to_have_attribute(
                "data-alive", "false", timeout=15_000
            )
            expect(page.locator('#sites tr[data-site="b"]')).to_contain_text("DOWN")
            expect(row.locator("td.state")).to_have_text("done", timeout=20_000)
            expect(page.locator("#story table.history")).to_contain_text("done", timeout=10_000)
            page.screenshot(path=str(screenshot_path()), full_page=True)
            assert errors == []
        finally:
            browser.close()
