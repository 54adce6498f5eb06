"""The dashboard of a live 3-node swarm, loaded by a real headless Chromium.

Three `swarm join` processes share rollouts over libp2p (the demo's setup); node-0 serves
its dashboard (`--dashboard`). Chromium runs the page's script against it; the numbers
it shows must be the ones in node-0's metrics.jsonl for the round it shows (computed
here from the raw lines, not through the dashboard's code), its peer table must list
both peers, and its Prometheus endpoint must agree. A screenshot is saved (set
`SWARM_DASHBOARD_SCREENSHOT` to keep it somewhere, e.g. docs/dashboard.png).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import statistics
import subprocess
import time
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

import pytest

from node.demo import write_configs
from node.metrics import read_metrics
from node.ports import free_port
from swarm.identity import load_or_create_key_file
from tests.node.process_helpers import start_join

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
WARM_ROUNDS = 15


class _Page(HTMLParser):
    """Headline cards (`data-key` -> value), the round shown, the peer table's rows."""

    def __init__(self) -> None:
        super().__init__()
        self.cards: dict[str, str] = {}
        self.round: str | None = None
        self.peer_titles: list[str] = []
        self.own_id: str | None = None
        """The full peer id the page shows for the node itself."""
        self.ends: list[str] = []
        """How the shown completions ended ([EOS] / [cut])."""
        self._in_self = False
        self._in_end = False
        self._key: str | None = None
        self._in_value = False
        self._in_peers = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "body":
            self.round = a.get("data-round")
        if "data-key" in a:
            self._key = a["data-key"]
        if a.get("class") == "value" and self._key:
            self._in_value = True
        if tag == "table" and a.get("id") == "peers":
            self._in_peers = True
        if self._in_peers and tag == "td" and a.get("class") == "mono" and a.get("title"):
            self.peer_titles.append(str(a["title"]))
        if tag == "p" and a.get("id") == "self":
            self._in_self = True
        if self._in_self and tag == "span" and a.get("class") == "mono" and a.get("title"):
            self.own_id = a["title"]
        self._in_end = tag == "span" and a.get("class") == "end"

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._in_peers = False
        if tag == "p":
            self._in_self = False

    def handle_data(self, data: str) -> None:
        if self._in_end:
            self.ends.append(data.strip())
            self._in_end = False
        if self._in_value and self._key:
            self.cards[self._key] = data.strip()
            self._in_value, self._key = False, None


def _chromium(url: str, *args: str) -> subprocess.CompletedProcess:
    assert CHROMIUM is not None
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--window-size=1400,1800", "--virtual-time-budget=6000", *args, url],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.skipif(
    CHROMIUM is None, reason="chromium not installed (apt-get install chromium; make test does)"
)
def test_chromium_shows_what_metrics_jsonl_says(tmp_path: Path) -> None:
    configs = write_configs(3, 100_000, tmp_path)
    port = free_port()
    procs = []
    for index, config in enumerate(configs):
        extra = ("--dashboard", f"127.0.0.1:{port}") if index == 0 else ()
        log = (tmp_path / f"node-{index}.log").open("a")
        procs.append(start_join(config, 100_000, stdout=subprocess.DEVNULL, stderr=log,
                                wait_peers=2, extra_args=extra))  # fmt: skip
        time.sleep(0.3)
    node0 = tmp_path / "node-0"
    peers = {load_or_create_key_file(tmp_path / f"node-{i}" / "node.key").peer_id for i in (1, 2)}
    try:
        deadline = time.monotonic() + 240
        while True:
            records = read_metrics(node0 / "metrics.jsonl")
            used = {p for r in records for p in r["external_by_sender"]}
            if len(records) >= WARM_ROUNDS and used == peers:
                break
            assert all(p.poll() is None for p in procs), (tmp_path / "node-0.log").read_text()
            assert time.monotonic() < deadline, f"{len(records)} rounds, used {used}"
            time.sleep(0.5)

        url = f"http://127.0.0.1:{port}/"
        dumped = _chromium(url, "--dump-dom")
        assert dumped.returncode == 0, dumped.stderr[-2000:]
        page = _Page()
        page.feed(dumped.stdout)
        screenshot = tmp_path / "dashboard.png"
        shot = _chromium(url, f"--screenshot={screenshot}")
        assert shot.returncode == 0 and screenshot.stat().st_size > 10_000, shot.stderr[-2000:]
        if os.environ.get("SWARM_DASHBOARD_SCREENSHOT"):
            shutil.copy(screenshot, os.environ["SWARM_DASHBOARD_SCREENSHOT"])
        with urllib.request.urlopen(url + "metrics", timeout=10) as response:
            prometheus = response.read().decode()
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGINT)
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()

    assert page.round is not None and int(page.round) >= WARM_ROUNDS, dumped.stdout[:2000]
    shown = int(page.round)
    lines = read_metrics(node0 / "metrics.jsonl")[:shown]  # what the page had read
    assert lines[-1]["round"] == shown
    rewards = [r["mean_local_reward"] for r in lines if r["mean_local_reward"] is not None]
    drops = lines[-1]["drops"]
    expected = {
        "round": str(shown),
        "policy_version": str(lines[-1]["policy_version"]),
        "peers": str(lines[-1]["peers"]),
        "reward_last": f"{statistics.fmean(rewards[-10:]):.3f}",
        "reward_first": f"{statistics.fmean(rewards[:10]):.3f}",
        "external_groups": str(sum(r["external_groups"] for r in lines)),
        "rounds_with_external": str(sum(1 for r in lines if r["external_groups"])),
        "no_signal": str(drops.get("zero_variance", 0) + drops.get("no_trainable_signal", 0)),
    }
    assert {k: page.cards.get(k) for k in expected} == expected
    assert peers <= set(page.peer_titles), page.peer_titles
    assert page.own_id == load_or_create_key_file(node0 / "node.key").peer_id
    assert page.ends and set(page.ends) <= {"[EOS]", "[cut]"}, page.ends
    scraped = re.search(r'^swarm_rounds_total\{node="node-0"\} (\S+)$', prometheus, re.M)
    assert scraped is not None and float(scraped.group(1)) >= shown
