"""The dashboard over real (stub-learner) nodes' data dirs: follower, view, HTTP, Prometheus."""

from __future__ import annotations

import asyncio
import json
import re
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from gossip.memory import MemoryNetwork
from node.dashboard.follow import DataDirFollower
from node.dashboard.server import Dashboard, bound_port, parse_listen, serve
from node.dashboard.view import MAX_POINTS, binned_mean, increments, node_view
from node.metrics import read_metrics
from node.peer_table import OwnProgress
from node.progress import headline
from node.run_summary import RunSummary, summarize
from swarm.errors import ConfigError
from swarm.identity import Identity
from swarm.messages import Hello
from tests.node.helpers import stub_config, stub_node
from tests.node.test_version_claims import envelope_of

ROUNDS = 12


@pytest.fixture(scope="module")
def swarm_dirs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Data dirs of two stub nodes that shared groups for ROUNDS rounds."""
    tmp = tmp_path_factory.mktemp("dash")
    network = MemoryNetwork("dashboard")
    configs = [stub_config(tmp, f"n{i}") for i in range(2)]
    nodes = [stub_node(c, network, seed=i) for i, c in enumerate(configs)]

    async def run() -> None:
        await asyncio.gather(*(n.run(ROUNDS) for n in nodes))

    asyncio.run(run())
    return [Path(c.node.data_dir) for c in configs]


def _get(dashboard: Dashboard, path: str) -> tuple[int, str, Any]:
    async def fetch() -> tuple[int, str, Any]:
        async with TestClient(TestServer(dashboard.app())) as client:
            response = await client.get(path)
            body = await response.text()
            kind = response.headers.get("Content-Type", "")
            return response.status, kind, json.loads(body) if "json" in kind else body

    return asyncio.run(fetch())


def test_the_node_writes_a_peer_table_of_what_it_measured(swarm_dirs: list[Path]) -> None:
    first = swarm_dirs[0]
    table = json.loads((first / "peers.json").read_text())
    assert table["round"] == ROUNDS
    (row,) = table["peers"]
    records = read_metrics(first / "metrics.jsonl")
    assert row["peer"] in {p for r in records for p in r["external_by_sender"]}
    assert row["link"] == "direct"  # the memory transport connects everybody
    most = 1.0 + stub_config(swarm_dirs[0].parent, "any").rewards.format_weight
    assert row["verified_groups"] > 0 and 0.0 <= row["reward"] <= most
    # What we used of the peer, and the mean reward of those groups, per round.
    used = [r for r in records if r["external_by_sender"]]
    assert all(set(r["external_reward_by_sender"]) == set(r["external_by_sender"]) for r in used)


def test_status_shows_the_dashboards_headline_and_peer_table(swarm_dirs: list[Path]) -> None:
    from rich.console import Console

    from node.progress import status_table

    console = Console(width=200, record=True)
    console.print(status_table(swarm_dirs[0], 10))
    text = console.export_text()
    _, _, view = _get(Dashboard(swarm_dirs), "/api/node/0")
    for card in view["headline"]:  # the same labels and values as the page's cards
        assert re.search(rf"{re.escape(card['label'])}\s+│\s+{re.escape(card['value'])}", text)
    peer = view["peers"]["peers"][0]
    assert f"{peer['peer'][:16]}…" in text
    assert f"{peer['model_id']} v{peer['policy_version']}; direct" in text


def test_a_peers_progress_claims_reach_the_peer_table(tmp_path: Path) -> None:
    node = stub_node(stub_config(tmp_path, "listener"), MemoryNetwork("claims-table"))
    peer = Identity.from_seed(b"\x42" * 32)
    said = (("rounds", 30.0), ("reward", 0.5), ("eval", 0.25))
    asyncio.run(node.take(envelope_of(node, peer, Hello("m", "f", 7, (), said), 7, 1)))
    (row,) = node.intake.peer_rows()
    assert row["claimed"] == dict(said) and row["policy_version"] == 7
    assert row["link"] == "indirect"  # heard of, never connected to us
    asyncio.run(node.take(envelope_of(node, peer, Hello("m", "f", 8), 8, 2)))
    (row,) = node.intake.peer_rows()
    assert row["claimed"] == {}  # only what its newest hello says
    progress = OwnProgress()
    for record in [
        {"round": 1, "mean_local_reward": 0.2, "eval": {"accuracy": 0.1}},
        {"round": 2, "mean_local_reward": 0.4, "eval": None},
    ]:
        progress.note(record)
    assert progress.claim() == (("rounds", 2.0), ("reward", 0.3), ("eval", 0.1))


def test_the_api_shows_the_numbers_of_metrics_jsonl(swarm_dirs: list[Path]) -> None:
    status, _, nodes = _get(Dashboard(swarm_dirs), "/api/nodes")
    assert status == 200 and [n["name"] for n in nodes] == ["n0", "n1"]
    status, _, view = _get(Dashboard(swarm_dirs), "/api/node/0")
    assert status == 200
    records = read_metrics(swarm_dirs[0] / "metrics.jsonl")
    shown = {h["key"]: h["value"] for h in view["headline"]}
    assert shown["round"] == str(records[-1]["round"])
    assert shown["policy_version"] == str(records[-1]["policy_version"])
    last10 = statistics.fmean(r["mean_local_reward"] for r in records[-10:])
    assert shown["reward_last"] == f"{last10:.3f}"
    assert shown["external_groups"] == str(sum(r["external_groups"] for r in records))
    assert view["reward"]["value"] == [round(r["mean_local_reward"], 5) for r in records]
    used: Counter[str] = Counter()
    for record in records:
        used.update(record["external_by_sender"])
    assert view["used_by_peer"] == dict(used)
    assert view["peers"]["peers"][0]["model_id"]
    assert view["samples"] and view["samples"][0]["completions"]
    assert _get(Dashboard(swarm_dirs), "/api/node/7")[0] == 404
    assert _get(Dashboard(swarm_dirs), "/api/node/x")[0] == 404
    assert _get(Dashboard(swarm_dirs), "/api/node/-1")[0] == 404


def test_the_page_and_its_assets_are_served_from_the_package(swarm_dirs: list[Path]) -> None:
    status, kind, page = _get(Dashboard(swarm_dirs), "/")
    assert status == 200 and "text/html" in kind and "/static/dashboard.js" in page
    assert "http" not in page.replace("http://www.w3.org", "")  # no CDN
    status, _, script = _get(Dashboard(swarm_dirs), "/static/dashboard.js")
    assert status == 200 and "innerHTML" not in script  # peers' strings go in as text


def test_prometheus_metrics_match_the_newest_metrics_line(swarm_dirs: list[Path]) -> None:
    status, kind, text = _get(Dashboard(swarm_dirs), "/metrics")
    assert status == 200 and kind.startswith("text/plain")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    for data_dir in swarm_dirs:
        final = read_metrics(data_dir / "metrics.jsonl")[-1]
        node = (("node", data_dir.name),)
        assert samples[("swarm_rounds_total", node)] == final["round"]
        assert samples[("swarm_policy_version", node)] == final["policy_version"]
        assert samples[("swarm_bytes_in_total", node)] == final["bytes_in"]
        assert samples[("swarm_peers", node)] == final["peers"]
        for reason, count in final["drops"].items():
            assert samples[("swarm_refused_total", (*node, ("reason", reason)))] == count


def test_the_follower_reads_only_complete_lines_and_starts_over_on_a_new_file(
    tmp_path: Path, swarm_dirs: list[Path]
) -> None:
    lines = (swarm_dirs[0] / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    path = tmp_path / "metrics.jsonl"
    follower = DataDirFollower(tmp_path)
    assert follower.poll() == 0  # no file yet
    path.write_bytes(lines[0] + lines[1][:10])  # a line being written
    assert follower.poll() == 1
    with path.open("ab") as f:
        f.write(lines[1][10:] + b"not json\n" + lines[2])
    assert follower.poll() == 2 and follower.corrupt_lines == 1
    assert follower.summary.final["round"] == 3
    path.write_bytes(lines[0])  # a fresh run in the same dir: shorter file
    assert follower.poll() == 1 and follower.summary.rounds_seen == 1


def test_a_bounded_summary_agrees_with_one_over_every_line(swarm_dirs: list[Path]) -> None:
    records = read_metrics(swarm_dirs[1] / "metrics.jsonl")
    bounded = RunSummary(last=3, max_history=2)
    for record in records:
        bounded.add(record)
    assert len(bounded.history) == 2
    assert bounded.summary() == summarize(records, 3)
    assert bounded.summary()["reward_last"] == pytest.approx(
        statistics.fmean(r["mean_local_reward"] for r in records[-3:])
    )


def test_series_are_binned_to_a_bounded_size() -> None:
    rounds = list(range(1, 10_001))
    series = binned_mean(rounds, [float(r % 2) for r in rounds])
    assert len(series["round"]) <= MAX_POINTS and series["round"][-1] == 10_000
    assert all(v == pytest.approx(0.5, abs=0.05) for v in series["value"])  # 25 rounds a bin
    assert binned_mean([1, 2, 3], [None, 1.0, None]) == {"round": [2], "value": [1.0]}


def test_increments_of_counters_survive_a_restarted_process() -> None:
    totals = [{"a": 1}, {"a": 3, "b": 1}, {"a": 1}, {"a": 2}]  # restart before the third
    assert increments(totals) == [{"a": 1}, {"a": 2, "b": 1}, {"a": 1}, {"a": 1}]


def test_a_view_is_rebuilt_only_when_the_data_dir_changed(swarm_dirs: list[Path]) -> None:
    dashboard = Dashboard(swarm_dirs)
    dashboard.poll()
    first = dashboard.view(0)
    assert dashboard.view(0) is first  # nothing changed: the same view
    (swarm_dirs[0] / "peers.json").touch()
    assert dashboard.view(0) is not first and dashboard.view(0) == first


def test_an_empty_data_dir_shows_no_rounds(tmp_path: Path) -> None:
    assert node_view(DataDirFollower(tmp_path)) == {
        "name": tmp_path.name,
        "data_dir": str(tmp_path),
        "rounds": 0,
    }


def test_listen_addresses() -> None:
    assert parse_listen("8600") == ("127.0.0.1", 8600)
    assert parse_listen("0.0.0.0:9000") == ("0.0.0.0", 9000)
    assert parse_listen(":0") == ("127.0.0.1", 0)
    with pytest.raises(ConfigError, match="HOST:PORT"):
        parse_listen("localhost:http")


def test_groups_without_trainable_signal_count_as_no_signal_not_refused() -> None:
    summary = {
        "drops": {"zero_variance": 5, "no_trainable_signal": 3, "bad_signature": 2},
        "eval_last": None,
        "overhead_fraction": None,
        "rounds": 1,
        "policy_version": 1,
        "peers": 1,
        "reward_last": 0.0,
        "reward_first": 0.0,
        "external_groups": 0,
        "rounds_with_external": 0,
    }
    shown = {key: value for key, _, value in headline(summary, 10)}
    assert (shown["no_signal"], shown["refused"]) == ("8", "2")


def test_the_bound_port_is_read_through_aiohttps_public_api(tmp_path: Path) -> None:
    async def run() -> int:
        runner = await serve(Dashboard([tmp_path]), "127.0.0.1", 0)
        try:
            return bound_port(runner)
        finally:
            await runner.cleanup()

    assert asyncio.run(run()) > 0
