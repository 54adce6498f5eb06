"""The dashboard over real (stub-learner) nodes' data dirs: follower, view, HTTP, Prometheus."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
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
from node.dashboard.view import (
    DOWN_S,
    MAX_POINTS,
    binned_mean,
    bins,
    increments,
    node_view,
    run_starts,
    sample_rows,
    seen_ago,
    time_split,
)
from node.metrics import read_metrics, read_node_info, write_node_info
from node.peer_table import OwnProgress
from node.progress import headline
from node.run_summary import RunSummary, summarize
from swarm.errors import ConfigError
from swarm.identity import Identity, write_key_file
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
    assert binned_mean([1, 2, 3], [None, 1.0, None]) == {
        "round": [2],
        "value": [1.0],
        "breaks": [],
    }


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
        "self": {"peer_id": None, "listen": [], "uptime": None, "restarts": []},
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


# ---- issue 34: what the page shows of the node, its peers, its time and its samples ----


def _view(data_dir: Path) -> dict[str, Any]:
    follower = DataDirFollower(data_dir)
    follower.poll()
    return node_view(follower)


def _copies(swarm_dirs: list[Path], tmp_path: Path) -> list[Path]:
    """The module's data dirs copied (a test here adds files to them)."""
    out = []
    for d in swarm_dirs:
        shutil.copytree(d, tmp_path / d.name)
        out.append(tmp_path / d.name)
    return out


def test_peers_are_named_where_the_dashboard_follows_them_and_the_node_says_who_it_is(
    swarm_dirs: list[Path], tmp_path: Path
) -> None:
    """Was: peers by truncated id only; not the node's own id or addresses."""
    n0, n1 = _copies(swarm_dirs, tmp_path)
    ids = [Identity.from_seed(bytes([seed + 1]) * 32).peer_id for seed in (0, 1)]  # stub_node's
    listen = ["/ip4/127.0.0.1/tcp/4001/p2p/" + ids[0]]
    assert write_node_info(n0, peer_id=ids[0], listen=listen)  # what a node writes on joining
    write_key_file(n1 / "node.key", Identity.from_seed(bytes([2]) * 32))  # no node-info: its key

    status, _, view = _get(Dashboard([n0, n1]), "/api/node/0")
    assert status == 200
    assert view["self"]["peer_id"] == ids[0] and view["self"]["listen"] == listen
    (row,) = view["peers"]["peers"]
    assert row["peer"] == ids[1] and row["name"] == "n1"
    assert view["peer_names"] == {ids[1]: "n1"}  # the page labels n1's series and bars so
    _, _, other = _get(Dashboard([n0, n1]), "/api/node/1")
    assert other["self"] == {**other["self"], "peer_id": ids[1], "listen": []}
    assert other["peer_names"] == {ids[0]: "n0"}
    # Followed alone, a peer has no name: the page shows its short id.
    _, _, alone = _get(Dashboard([n0]), "/api/node/0")
    assert alone["peers"]["peers"][0]["name"] is None and alone["peer_names"] == {}


def test_uptime_counts_from_the_newest_start_and_the_last_line_is_dated(
    swarm_dirs: list[Path], tmp_path: Path
) -> None:
    records = read_metrics(swarm_dirs[0] / "metrics.jsonl")
    assert run_starts(list(_history(records))) == []  # a node that ran throughout
    view = _view(swarm_dirs[0])
    up = view["self"]["uptime"]
    first, last = records[0], records[-1]
    assert up["since_round"] == 1 and up["last_time"] == last["time"]
    up_s = last["time"] - first["time"] + first["seconds"]["total"]
    assert up["up_s"] == pytest.approx(up_s, abs=1e-3)
    _, _, served = _get(Dashboard(swarm_dirs), "/api/node/0")
    assert served["seen_ago_s"] is not None and served["seen_ago_s"] >= 0  # same machine
    assert seen_ago(view, last["time"] + 12.34) == 12.3
    assert seen_ago(view, last["time"] - 1) is None  # another machine's clock, or boot's


def _history(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    summary = RunSummary(max_history=10_000)
    for record in records:
        summary.add(record)
    return list(summary.history)


def _with_restarts(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The run as if the node had been down twice: 100 s after round 4 (back at round 5),
    and killed after round 8 to resume from round 6's checkpoint (its totals from 0)."""
    out = [dict(r) for r in records[:4]]
    out += [{**r, "time": r["time"] + 100.0} for r in records[4:8]]
    for r in records[5:]:  # rounds 6.. again, by a new process
        out.append({**r, "time": r["time"] + 300.0, "drops": {}, "bytes_in": 0, "bytes_out": 0})
    return out


def test_lines_break_where_the_node_was_not_running(swarm_dirs: list[Path], tmp_path: Path) -> None:
    """Was: lines drawn across the gaps of a node that was down."""
    lines = _with_restarts(read_metrics(swarm_dirs[0] / "metrics.jsonl"))
    data_dir = tmp_path / "restarted"
    data_dir.mkdir()
    (data_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    starts = run_starts(_history(lines))
    assert [i for i, _ in starts] == [4, 8]
    assert starts[0][1] == pytest.approx(100.0, abs=DOWN_S)  # the seconds it was down
    view = _view(data_dir)
    assert view["reward"]["breaks"] == [4, 8] and view["round_seconds"]["breaks"] == [4, 8]
    assert view["reward"]["round"] == [r["round"] for r in lines]  # 1-8, then 6-12 again
    assert view["refusals"]["breaks"] == [4, 8]
    for peer, series in view["peer_reward"].items():  # a peer's points: rounds it was used
        at = [i for i, r in enumerate(lines) if peer in r["external_reward_by_sender"]]
        after = [j for j in range(1, len(at)) if any(at[j - 1] < s <= at[j] for s in (4, 8))]
        assert series["breaks"] == after
    assert [(r["after_round"], r["round"]) for r in view["self"]["restarts"]] == [(4, 5), (8, 6)]
    up = view["self"]["uptime"]  # since the newest start, not the run's first round
    assert up["since_round"] == 6
    up_s = lines[-1]["time"] - lines[8]["time"] + lines[8]["seconds"]["total"]
    assert up["up_s"] == pytest.approx(up_s, abs=1e-3)


def test_binning_never_spans_a_break_and_stays_bounded() -> None:
    n, starts = 10_000, list(range(7, 10_000, 7))  # a restart every 7 rounds
    spans = bins(n, starts=starts)
    assert len(spans) <= MAX_POINTS and [i for s in spans for i in s] == list(range(n))
    kept = starts[-(MAX_POINTS // 4) :]  # the newest breaks (older ones are merged)
    assert set(kept) <= {span.start for span in spans}
    assert all(not (span.start < s < span.stop) for span in spans for s in kept)
    few = binned_mean(list(range(1, 11)), [1.0] * 5 + [None] * 2 + [2.0] * 3, starts=[5])
    assert few["breaks"] == [5]  # the break lands on the first point after it


def test_the_round_time_split_adds_up_to_the_round(swarm_dirs: list[Path]) -> None:
    """Was: every timing drawn as a part, so the parts summed past the round (sampling and
    scoring run ahead of it with prefetch, `sample_wait` is the part of the round)."""
    seconds = {"sample_wait": 0.1, "train": 0.5, "other": 0.1, "total": 0.7, "sample": 0.4,
               "score": 0.05}  # fmt: skip
    split = time_split([{"seconds": seconds}])
    assert split["total"] == 0.7 and sum(split["parts"].values()) == pytest.approx(0.7)
    assert list(split["parts"]) == ["sample_wait", "train", "other"]
    assert split["overlapping"] == {"sample": 0.4, "score": 0.05}
    # Lines of versions before `sample_wait`: sampling and scoring were parts of the round.
    old = {"sample": 0.3, "score": 0.1, "train": 0.5, "other": 0.1, "total": 1.0}
    split = time_split([{"seconds": old}])
    assert sum(split["parts"].values()) == pytest.approx(1.0) and split["overlapping"] == {}
    shown = _view(swarm_dirs[0])["time_split"]
    assert sum(shown["parts"].values()) == pytest.approx(shown["total"], abs=1e-3)
    assert "sample" not in shown["parts"] and "sample" in shown["overlapping"]


def test_samples_say_how_each_completion_ended() -> None:
    """Was: `[EOS]` never shown (only a `[cut]`)."""
    record = {
        "round": 3,
        "task": {"source": "add", "index": 1},
        "prompt": "1+1=",
        "completions": ["2", "22222", "2"],
        "rewards": [1.0, 0.0, 1.0],
        "finished": [True, False, True],
    }
    (row,) = sample_rows([record])
    assert [c["end"] for c in row["completions"]] == ["[EOS]", "[cut]", "[EOS]"]
    (row,) = sample_rows([{**record, "finished": None}])  # a learner that does not say
    assert [c["end"] for c in row["completions"]] == ["", "", ""]


def test_the_page_draws_what_the_view_gives(swarm_dirs: list[Path]) -> None:
    """The script uses the fields above (no browser here: the browser test runs it)."""
    _, _, script = _get(Dashboard(swarm_dirs), "/static/dashboard.js")
    for used in ("peer_names", "breaks", "restarts", "seen_ago_s", "listen", "overlapping",
                 "c.end", 'unit: "s"'):  # fmt: skip
        assert used in script, used


def test_a_running_node_says_who_it_is_for_the_dashboard(swarm_dirs: list[Path]) -> None:
    """Each node wrote its peer id (and listen addresses: none on the memory transport)
    once it joined; the dashboard's headline reads them from there."""
    for data_dir in swarm_dirs:
        info = read_node_info(data_dir)
        assert info is not None and info["peer_id"].startswith("12D3KooW")
        assert info["listen"] == []
    assert read_node_info(swarm_dirs[0])["peer_id"] != read_node_info(swarm_dirs[1])["peer_id"]
