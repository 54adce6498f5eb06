"""`swarm demo` (the README's first command): a few tiny-model nodes on 127.0.0.1.

Each node is a real `swarm join` OS process with its own key, config and data dir,
talking libp2p over loopback. The demo prints one line per node per round, then a
summary table and a reward plot (`<out>/reward.png`). It starts fresh every time.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import tomli_w
from rich.console import Console
from rich.table import Table

from node.metrics import read_metrics
from node.ports import free_port
from node.run_summary import no_signal, summarize
from swarm.errors import ConfigError
from swarm.identity import write_key_file


def demo_config(
    index: int, out: Path, port: int, bootstrap: list[str], rounds: int
) -> dict[str, Any]:
    """The demo node's config: the config models' defaults (they learn: the tiny model
    from scratch on the `digit` task, SAPO 4 local / 4 external), and what is the node's
    own: name, data dir, address, and seeds fixed per index."""
    return {
        "node": {
            "name": f"node-{index}",
            "data_dir": str(out / f"node-{index}"),
            "checkpoint_every": max(rounds // 2, 1),
        },
        "transport": {
            "type": "libp2p",
            "listen": f"/ip4/127.0.0.1/tcp/{port}",
            "bootstrap": bootstrap,
        },
        # Fixed per index, not derived from the keys (new at every demo): a demo repeats.
        "model": {"seed": index},
        "tasks": {"seed": 1000 + index},
    }


def write_configs(nodes: int, rounds: int, out: Path) -> list[Path]:
    ports = [free_port() for _ in range(nodes)]
    peer_ids = []
    for index in range(nodes):
        identity = write_key_file(out / f"node-{index}" / "node.key", overwrite=True)
        peer_ids.append(identity.peer_id)
    paths = []
    for index in range(nodes):
        # A line topology: each node knows only the previous one; gossip does the rest.
        bootstrap = (
            [f"/ip4/127.0.0.1/tcp/{ports[index - 1]}/p2p/{peer_ids[index - 1]}"] if index else []
        )
        path = out / f"node-{index}.toml"
        path.write_text(tomli_w.dumps(demo_config(index, out, ports[index], bootstrap, rounds)))
        paths.append(path)
    return paths


JOIN_ENV = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
"""Several nodes share a small machine: one torch thread each."""


def join_command(config: Path, rounds: int, wait_peers: int = 0) -> list[str]:
    """`swarm join --json` for `config`; with `wait_peers`, its first round waits (up to
    120 s) for that many peers."""
    command = [sys.executable, "-m", "cli.main", "join", "--config", str(config)]
    command += ["--rounds", str(rounds), "--json"]
    if wait_peers:
        command += ["--wait-peers", str(wait_peers), "--wait-timeout", "120"]
    return command


def spawn_join(
    config: Path,
    rounds: int,
    *,
    stdout: Any,
    stderr: Any,
    wait_peers: int = 0,
) -> subprocess.Popen:
    """Start `join_command(...)` as its own OS process, with one torch thread."""
    return subprocess.Popen(
        join_command(config, rounds, wait_peers),
        stdout=stdout,
        stderr=stderr,
        text=True,
        env={**os.environ, **JOIN_ENV},
    )


def _pump(name: str, stream: Any, lines: queue.Queue) -> None:
    for line in stream:
        lines.put((name, line))
    lines.put((name, None))


DEMO_MARKER = ".swarm-demo"
"""Written into a demo's output folder: a later demo may replace that folder, no other."""


def clear_output(out: Path, force: bool) -> None:
    """Make `out` an empty folder for a demo. Only a previous demo's folder (it holds
    `DEMO_MARKER`) or, with `force`, any folder is deleted; anything else is refused."""
    if out.exists():
        if not out.is_dir():
            raise ConfigError(f"{out}: not a folder; give --out a folder for the demo's nodes")
        previous_demo = (out / DEMO_MARKER).is_file()
        if any(out.iterdir()) and not previous_demo and not force:
            raise ConfigError(
                f"{out}: exists and was not written by a demo; give another --out, or pass "
                "--force to delete everything in it"
            )
        shutil.rmtree(out)
    out.mkdir(parents=True)
    (out / DEMO_MARKER).write_text("written by `swarm demo`; a later demo replaces this folder\n")


def run_demo(
    nodes: int,
    rounds: int,
    out: Path,
    console: Console,
    dashboard: str | None = None,
    force: bool = False,
) -> int:
    """Run the demo; with `dashboard` (PORT or HOST:PORT), serve a dashboard of all nodes."""
    clear_output(out, force)
    configs = write_configs(nodes, rounds, out)
    server = None
    if dashboard is not None:
        from node.dashboard.server import DashboardThread, parse_listen

        server = DashboardThread(
            [out / f"node-{i}" for i in range(nodes)], *parse_listen(dashboard)
        )
        console.print(f"dashboard of all nodes: {server.url}", highlight=False)
    try:
        return _run_nodes(nodes, rounds, out, configs, console)
    finally:
        if server is not None:
            server.stop()


def _run_nodes(nodes: int, rounds: int, out: Path, configs: list[Path], console: Console) -> int:
    procs: dict[str, subprocess.Popen] = {}
    lines: queue.Queue = queue.Queue()
    console.print(
        f"starting {nodes} nodes on 127.0.0.1 (libp2p), {rounds} rounds each; data in {out}"
    )
    for index, config in enumerate(configs):
        name = f"node-{index}"
        log = (out / f"{name}.log").open("w")
        # Started together, each waits for the others: nobody trains its first rounds alone.
        procs[name] = spawn_join(
            config, rounds, stdout=subprocess.PIPE, stderr=log, wait_peers=nodes - 1
        )
        threading.Thread(target=_pump, args=(name, procs[name].stdout, lines), daemon=True).start()
        time.sleep(0.5)  # let each listener come up before the next one dials it
    open_streams = len(procs)
    try:
        while open_streams:
            name, line = lines.get()
            if line is None:
                open_streams -= 1
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                console.print(f"{name}: {line.rstrip()}", highlight=False, soft_wrap=True)
                continue
            reward = record["mean_local_reward"]
            peers = len(record["external_by_sender"])
            console.print(
                f"{name} round {record['round']:>3}  reward {reward:.3f}  "
                f"external groups {record['external_groups']} from {peers} peers",
                highlight=False,
            )
    except KeyboardInterrupt:
        for proc in procs.values():
            proc.terminate()
    codes = {name: proc.wait() for name, proc in procs.items()}
    table = Table(title="swarm demo")
    for column in (
        "node",
        "exit",
        "reward first 10",
        "reward last 10",
        "external used",
        "peers used",
        "no signal",
        "refused",
    ):
        table.add_column(column)
    curves = {}
    evals: dict[str, list[tuple[int, float]]] = {}
    for index in range(nodes):
        name = f"node-{index}"
        records = read_metrics(out / name / "metrics.jsonl")
        if not records:
            table.add_row(name, str(codes[name]), "-", "-", "-", "-", "-", "-")
            continue
        s = summarize(records, 10)
        curves[name] = [r["mean_local_reward"] for r in records]
        evals[name] = [(r["round"] - 1, r["eval"]["accuracy"]) for r in records if r.get("eval")]
        table.add_row(
            name,
            str(codes[name]),
            f"{s['reward_first']:.3f}",
            f"{s['reward_last']:.3f}",
            str(s["external_groups"]),
            str(len(s["external_by_sender"])),
            str(no_signal(s["drops"])),
            str(sum(s["drops"].values()) - no_signal(s["drops"])),
        )
    console.print(table)
    console.print(
        "no signal: peers' groups whose completions all scored the same, or differ only in "
        "completions that never ended (GRPO learns nothing from them); refused: anything "
        "else dropped, by reason in metrics.jsonl",
        highlight=False,
    )
    if curves:
        plot = plot_rewards(curves, out / "reward.png", evals)
        console.print(f"reward plot: {plot}; per-node logs in {out}/node-*.log")
    return 0 if all(code == 0 for code in codes.values()) else 1


def plot_rewards(
    curves: dict[str, list[float]],
    path: Path,
    evals: dict[str, list[tuple[int, float]]] | None = None,
) -> Path:
    """Smoothed own-sample reward per node; with `evals`, each node's held-out greedy
    accuracy (evaluated at the start of a round: after `round` rounds of training)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, rewards in curves.items():
        window = 5
        smooth = [
            sum(rewards[max(0, i - window + 1) : i + 1])
            / len(rewards[max(0, i - window + 1) : i + 1])
            for i in range(len(rewards))
        ]
        line = ax.plot(range(1, len(rewards) + 1), smooth, label=name)[0]
        points = (evals or {}).get(name) or []
        if points:
            ax.plot(
                [x for x, _ in points],
                [y for _, y in points],
                marker="s",
                linestyle="--",
                color=line.get_color(),
                label=f"{name} held-out accuracy",
            )
    ax.set_xlabel("round")
    ax.set_ylabel("own reward (5-round mean) / held-out acc.")
    ax.set_title("swarm demo: nodes sharing rollouts over libp2p")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
