"""The fleet dashboard (`/fleet`), against a real fleet of broker processes: its sign-in and
session rules over plain HTTP, then the page itself in a real headless Chromium (Debian's,
driven by Playwright), which must show a styled sign-in form, every site with its whole name,
the last ten minutes of utilization as it opens, a job as it is submitted, its story with the
F(j) terms of its decision, and a killed broker as down. Screenshots are kept in
``out/screenshots/`` (or ``$GBROKER_ARTIFACTS``): CI's artifact. Chromium is required: the test
fails (never skips) without it, since CI installs it with ``scripts/setup/ensure_chromium.sh``."""

from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gbroker.security.auth import Tokens
from gbroker.topology import SiteSpec, Topology, save_topology
from tests.harness import gbroker

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
ASSETS = [
    ("dashboard.css", "text/css"),
    ("dashboard.js", "application/javascript"),
    ("uplot.js", "application/javascript"),
    ("uplot.css", "text/css"),
]
LONG = "Opteron24-frontier"  # a site name much wider than its node
BUCKET = 10  # seconds per plotted bucket (gbroker.daemon.dashboard.BUCKET_SECONDS)


@dataclass
class Fleet:
    directory: Path
    urls: dict[str, str]
    token: str


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    topology = tmp_path / "three.yaml"
    sites = [SiteSpec("a", 2), SiteSpec("b", 2), SiteSpec(LONG, 8)]
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
    for path in ("/api/v1/fleet", "/api/v1/decisions", "/api/v1/utilization", "/api/v1/info"):
        assert call(url + path)[0] == 401, path
    # The page's static assets hold nothing of the fleet: served to anyone, so the sign-in form
    # is styled; anything else under them is unknown.
    for name, kind in ASSETS:
        status, headers, body = call(f"{url}/fleet/static/{name}")
        assert (status, headers["Content-Type"].split(";")[0]) == (200, kind), name
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert body
    assert call(f"{url}/fleet/static/tokens")[0] == 404
    assert call(f"{url}/fleet/static/dashboard.css", b"x")[0] == 401  # reading only
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
    assert [s["name"] for s in facts["sites"]] == ["a", "b", LONG]
    assert all(s["alive"] for s in facts["sites"])
    # The cookie opens reads only: a submission with it alone is refused.
    job = b"executable: /bin/true\n"
    assert call(f"{url}/api/v1/jobs", job, session)[0] == 401
    # Another broker does not know this session.
    assert call(f"{fleet.urls['b']}/api/v1/fleet", headers=session)[0] == 401


def screenshot_path(name: str = "fleet-dashboard") -> Path:
    directory = Path(os.environ.get("GBROKER_ARTIFACTS", ROOT / "out" / "screenshots"))
    directory.mkdir(parents=True, exist_ok=True)
    return directory / f"{name}.png"


# Each site's name in the graph: its text, where it is drawn, and what a point of it shows.
NAMES = """() => [...document.querySelectorAll('#graph g.site')].map((group) => {
  const name = group.querySelector('text.name');
  const box = name.getBoundingClientRect();
  const graph = document.querySelector('#graph').getBoundingClientRect();
  const seen = document.elementFromPoint(box.x + box.width / 2, box.y + box.height / 2);
  return {site: group.dataset.site, text: name.textContent, fill: getComputedStyle(name).fill,
          box: [box.left, box.top, box.right, box.bottom],
          graph: [graph.left, graph.top, graph.right, graph.bottom],
          topmost: seen === name, width: name.getComputedTextLength()};
})"""


def assert_names_fully_visible(page: Any) -> None:
    names = page.evaluate(NAMES)
    assert sorted(n["site"] for n in names) == sorted(["a", "b", LONG])
    for name in names:
        assert name["text"] == name["site"]
        left, top, right, bottom = name["box"]
        g_left, g_top, g_right, g_bottom = name["graph"]
        assert g_left <= left < right <= g_right, name  # whole: inside the drawing
        assert g_top <= top < bottom <= g_bottom, name
        # Dark on the white page: a white name wider than its green node was cut to what the
        # node showed ("Opteron24" read "pteron2").
        assert name["fill"] != "rgb(255, 255, 255)", name
        assert name["topmost"], name  # nothing drawn over it
    long = next(n for n in names if n["site"] == LONG)
    assert long["width"] > 2 * 30  # wider than its node's ring: the case that used to be cut
    boxes = [n["box"] for n in names]
    for i, (l1, t1, r1, b1) in enumerate(boxes):
        for l2, t2, r2, b2 in boxes[i + 1 :]:
            assert r1 <= l2 or r2 <= l1 or b1 <= t2 or b2 <= t1, "two names overlap"


def test_the_dashboard_in_a_real_browser(fleet: Fleet, tmp_path: Path) -> None:
    if not CHROMIUM.exists():
        pytest.fail(
            "Chromium is not installed and the dashboard test needs it: run "
            "`bash scripts/setup/ensure_chromium.sh`",
            pytrace=False,
        )
    from playwright.sync_api import expect, sync_playwright

    url = fleet.urls["a"]
    tokens = str(fleet.directory / "tokens")
    # Work done before anyone opens the page: the plot must show it all the same.
    earlier = tmp_path / "earlier.yaml"
    earlier.write_text(BIG_JOB.replace("name: big", "name: earlier"))
    done = gbroker("submit", str(earlier), "--broker", url, "--token-file", tokens, "--wait")
    assert done.returncode == 0, done.stderr
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1100})
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            assets: list[tuple[str, int]] = []
            page.on(
                "response",
                lambda r: assets.append((r.url, r.status)) if "/fleet/static/" in r.url else None,
            )
            page.goto(f"{url}/fleet")
            # The sign-in form is styled: its stylesheet loads without a session.
            form = page.locator("body.login main")
            expect(form).to_have_css("max-width", "420px")  # 30em of 14px
            expect(form).to_have_css("background-color", "rgb(255, 255, 255)")
            assert [(u.rsplit("/", 1)[1], status) for u, status in assets] == [
                ("dashboard.css", 200)
            ]
            page.screenshot(path=str(screenshot_path("fleet-sign-in")))
            opened = time.time()
            page.fill("#token", fleet.token)
            page.click("button[type=submit]")
            # Every site, up, in the graph and in the table.
            for site in ("a", "b", LONG):
                expect(page.locator(f'#graph g.site[data-site="{site}"]')).to_have_attribute(
                    "data-alive", "true", timeout=15_000
                )
                expect(page.locator(f'#sites tr[data-site="{site}"]')).to_be_visible()
            # Every name whole and readable, the long one too.
            assert_names_fully_visible(page)
            # Utilization over the last ten minutes as the page opens, the earlier job in it.
            plot = page.locator("#plot-utilization")
            expect(plot).to_have_attribute("data-known", re.compile(r"[1-9]"), timeout=10_000)
            window = float(plot.get_attribute("data-to") or 0) - float(
                plot.get_attribute("data-from") or 0
            )
            assert window >= 600 - BUCKET
            busy_from = float(plot.get_attribute("data-first-busy") or "inf")
            assert busy_from < opened + BUCKET  # busy before the page opened: history
            assert float(plot.get_attribute("data-peak") or 0) > 0
            # A job submitted now shows up; only LONG has 8 cores, so it moves from a to it.
            job = tmp_path / "big.yaml"
            job.write_text(BIG_JOB)
            submitted = gbroker("submit", str(job), "--broker", url, "--token-file", tokens)
            assert submitted.returncode == 0, submitted.stderr
            job_id = submitted.stdout.strip()
            row = page.locator(f'#jobs tr[data-job="{job_id}"]')
            expect(row).to_be_visible(timeout=15_000)
            expect(page.locator(f'#graph line.move[data-job="{job_id}"]')).to_have_count(1)
            # Its story: the history from its owner, and the F(j) terms of the decision.
            row.click()
            expect(page.locator("#story-job")).to_have_text(job_id)
            expect(page.locator("#story table.history")).to_be_visible(timeout=10_000)
            chosen = page.locator(f'#story table.terms tr.chosen[data-site="{LONG}"]')
            expect(chosen).to_be_visible(timeout=10_000)
            expect(page.locator("#story")).to_contain_text(f"ran at {LONG}")
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


def test_utilization_is_the_mean_of_busy_cores_per_bucket_over_ten_minutes() -> None:
    from gbroker.daemon.dashboard import BUCKET_SECONDS, HISTORY_SECONDS, Utilization

    used = Utilization(1000.0, 0)  # the broker started at 1000, idle
    used.observe(1002.0, 4)  # 4 cores busy from 1002 to 1007
    used.observe(1007.0, 0)
    used.observe(1013.0, 2)  # 2 from 1013 on
    series = used.series(1015.0)
    assert len(series) == HISTORY_SECONDS // BUCKET_SECONDS
    assert series[-2:] == [(1000, 4 * 5 / 10), (1010, 2 * 2 / 5)]  # the last one: 5 s so far
    assert all(busy is None for _, busy in series[:-2])  # before the broker: unknown
    # Later, the old buckets go (bounded memory); a quiet hour is one level, and counted once
    # even if the clock is set back.
    later = used.series(1015.0 + 3600)
    assert [busy for _, busy in later] == [2.0] * len(later)
    used.observe(1015.0 + 3500, 6)  # before the last look: nothing counted twice
    assert [busy for _, busy in used.series(1015.0 + 3600)] == [2.0] * len(later)
    assert len(used._buckets) <= HISTORY_SECONDS // BUCKET_SECONDS + 1
