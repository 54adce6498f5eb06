"""A mixed-speed pair as real `swarm join` processes: the tiny model next to a real one.

Node A runs `--fast-model` (default `builtin:tiny`, a round takes ~30 ms here; give the
real model's folder there too for two real-model nodes); node B runs the model at
`--slow-model` (any HF causal LM folder or id, e.g. SmolLM2-135M-Instruct converted as in
`../shared/notes/real-model-offline.md`; a round takes tens of seconds on CPU). Both use
the demo's task (`digit`, or `--task`) and SAPO 4/4 (a real model gets 16 new tokens:
room for its answer block); B waits for A (`--wait-peers 1`), runs
`--rounds`, and A runs until B is done. The table shows, per node: rounds, seconds per
round, rounds that trained on the other's groups, the version lag of what was used, and
what was refused, read from both nodes' metrics.jsonl, and the share of each node's own
completions that carry the EOS bit (from its samples.jsonl: what it published).

    .venv/bin/python benchmarks/mixed_speed.py --slow-model /path/to/SmolLM2-135M-Instruct

This measures what the staleness rule does with a ~1000x speed gap: the slow node can
only use the fast node's newest groups (at most `max_version_lag` versions behind what
the fast node runs when the slow node selects), the fast node uses each slow group for
`max_staleness` of its own rounds after it arrived. Whether the groups carry signal
(reward variance) depends on the models, not the protocol: the refusals say.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tomli_w

from node.demo import spawn_join, write_configs
from node.metrics import read_metrics
from node.samples import read_samples
from swarm.identity import load_or_create_key_file


def _summary(records: list[dict[str, Any]], other: str) -> dict[str, Any]:
    used = [r for r in records if other in r["external_by_sender"]]
    lags = [int(lag) for r in used for lag, n in r["version_lag"].items() for _ in range(n)]
    seconds = [r["seconds"]["total"] for r in records]
    return {
        "rounds": len(records),
        "s_per_round": statistics.median(seconds) if seconds else None,
        "rounds_using_other": len(used),
        "groups_from_other": sum(r["external_by_sender"].get(other, 0) for r in records),
        "max_lag": max(lags) if lags else None,
        "refused": dict(Counter(records[-1]["drops"]).most_common(3)) if records else {},
        "mean_reward": statistics.fmean(
            [r["mean_local_reward"] for r in records if r["mean_local_reward"] is not None] or [0.0]
        ),
    }


def measure(
    slow_model: str, rounds: int, out: Path, fast_model: str = "builtin:tiny", task: str = "digit"
) -> dict[str, dict[str, Any]]:
    config_a, config_b = write_configs(2, 100_000, out)
    for path, model in ((config_a, fast_model), (config_b, slow_model)):
        config = tomllib.loads(path.read_text())  # the demo's: a node's own keys only
        config.setdefault("model", {})["name_or_path"] = model
        config["tasks"] = {**config.get("tasks", {}), "mixture": [{"source": task}]}
        if not model.startswith("builtin:"):  # room for "<answer>7</answer>" and EOS
            config["sampler"] = {**config.get("sampler", {}), "max_new_tokens": 16}
        if path == config_b:
            config["node"]["checkpoint_every"] = rounds
        path.write_text(tomli_w.dumps(config))
    id_a = load_or_create_key_file(out / "node-0" / "node.key").peer_id
    id_b = load_or_create_key_file(out / "node-1" / "node.key").peer_id
    with (out / "a.log").open("w") as log_a, (out / "b.log").open("w") as log_b:
        a = spawn_join(config_a, 1_000_000, stdout=subprocess.DEVNULL, stderr=log_a)
        try:
            time.sleep(5)
            b = spawn_join(config_b, rounds, stdout=subprocess.DEVNULL, stderr=log_b, wait_peers=1)
            started = time.monotonic()
            while b.poll() is None:
                done = len(read_metrics(out / "node-1" / "metrics.jsonl"))
                print(
                    f"\rslow node: {done}/{rounds} rounds, {time.monotonic() - started:.0f} s",
                    end="",
                    file=sys.stderr,
                    flush=True,
                )
                time.sleep(2)
            print(file=sys.stderr)
            if b.returncode != 0:
                raise RuntimeError(f"the slow node failed: see {out / 'b.log'}")
        finally:
            a.send_signal(signal.SIGINT)
            a.wait(timeout=120)
    records_b = read_metrics(out / "node-1" / "metrics.jsonl")
    first, last = records_b[0]["time"], records_b[-1]["time"]
    records_a = [
        r for r in read_metrics(out / "node-0" / "metrics.jsonl") if first - 60 <= r["time"] <= last
    ]
    return {
        f"A ({Path(fast_model).name})": {
            **_summary(records_a, id_b),
            "eos_shared": eos_share(out / "node-0" / "samples.jsonl"),
        },
        f"B ({Path(slow_model).name})": {
            **_summary(records_b, id_a),
            "eos_shared": eos_share(out / "node-1" / "samples.jsonl"),
        },
    }


def eos_share(samples: Path) -> float | None:
    """Share of the node's own recent completions (what it published) with the EOS bit."""
    bits = [b for r in read_samples(samples) for b in (r.get("finished") or [])]
    return sum(bits) / len(bits) if bits else None


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slow-model", required=True, help="HF model folder or id")
    parser.add_argument("--rounds", type=int, default=4, help="rounds of the slow node")
    parser.add_argument("--fast-model", default="builtin:tiny", help="node A's model")
    parser.add_argument("--task", default="digit", help="built-in task both nodes use")
    parser.add_argument("--keep", type=Path, help="keep the nodes' data here")
    args = parser.parse_args()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        result = measure(args.slow_model, args.rounds, args.keep, args.fast_model, args.task)
    else:
        with tempfile.TemporaryDirectory(prefix="mixed-speed-") as tmp:
            result = measure(args.slow_model, args.rounds, Path(tmp), args.fast_model, args.task)
    print(
        "| node | rounds (while both ran) | s / round (median) | rounds using the other "
        "| groups from the other | max version lag used | mean own reward | EOS bit set in "
        "own groups | top refusals |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, s in result.items():
        print(
            f"| {name} | {s['rounds']} | {s['s_per_round']} | {s['rounds_using_other']} "
            f"| {s['groups_from_other']} | {s['max_lag']} | {s['mean_reward']:.3f} "
            f"| {_pct(s['eos_shared'])} | {s['refused']} |"
        )


if __name__ == "__main__":
    main()
