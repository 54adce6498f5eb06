"""Tiny-model mode: real `PolicyLearner`s (builtin:tiny) in simnet, deterministic."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from simnet.engine import Simulation
from tests.simnet.helpers import records, scenario


def test_tiny_model_nodes_run_deterministically(tmp_path: Path) -> None:
    run = scenario(
        rounds=3,
        defaults={
            "sapo": {"local_groups": 2, "external_groups": 2},
            "sampler": {"group_size": 4, "max_new_tokens": 3},
        },
        nodes=[{"name": "t", "count": 2, "model": "builtin:tiny"}],
    )
    first = Simulation(run, None, 0, tmp_path / "a").run()
    second = Simulation(run, None, 0, tmp_path / "b").run()
    for name in ("t-0", "t-1"):
        a = (tmp_path / "a" / name / "metrics.jsonl").read_bytes()
        assert a == (tmp_path / "b" / name / "metrics.jsonl").read_bytes()
        lines = records(tmp_path / "a", name)
        assert [r["round"] for r in lines] == [1, 2, 3]
        assert all(r["train"]["seconds"] == r["seconds"]["train"] for r in lines)
    assert first == second
    assert {n["model"] for n in first["nodes"]} == {"builtin:tiny"}


def test_overlapped_tiny_nodes_sample_from_two_rounds_back_and_take_the_longer_phase(
    tmp_path: Path,
) -> None:
    """`sampler.overlap` in simnet: round k samples the weights after round k - 2, and a
    round's modeled time is about the longer of sampling and training, not their sum."""
    durations = {}
    for overlap in (False, True):
        run = scenario(
            rounds=6,
            # A base that gets a third right: groups with signal, so every round trains.
            warmstart={
                "tasks": [{"source": "add", "weight": 1.0}],
                "steps": 80,
                "batch": 64,
                "lr": 1e-3,
                "answers": "true",
            },
            defaults={
                "sapo": {"local_groups": 4, "external_groups": 0},
                "tasks": {"mixture": [{"source": "add", "weight": 1.0}]},
                "sampler": {"group_size": 8, "max_new_tokens": 3, "overlap": overlap},
            },
            nodes=[{"name": "t", "count": 1, "model": "builtin:tiny"}],
            compute={
                "sample_s_per_group": 1.0,
                "train_s_per_group": 0.5,
                "round_overhead_s": 0.5,
                "jitter": 0.0,
            },
        )
        Simulation(run, None, 0, tmp_path / str(overlap)).run()
        lines = records(tmp_path / str(overlap), "t")
        lag = 2 if overlap else 1
        versions = [0] + [r["policy_version"] for r in lines]
        assert versions[-1] >= 4  # it trained: the lag is observable
        assert [r["sampled_version"] for r in lines] == [
            versions[max(k - lag, 0)] for k in range(1, len(lines) + 1)
        ]
        durations[overlap] = lines[-1]["time"] - lines[1]["time"]
    # 4 rounds of sampling 4 s + training 2.5 s: 26 s in turn, 16 s overlapped.
    assert durations[False] >= 26.0 - 1e-6
    assert durations[True] <= 16.5


def _two_tiny_nodes_steps(
    run_dir: Path, train: dict[str, str], init: str | None = None
) -> list[dict[str, Any]]:
    """The training steps' records of two tiny-model nodes sharing 2 of 4 groups a round
    for 4 rounds with these `[train]` settings (`init = "shared"`: one base)."""
    node: dict[str, Any] = {"name": "t", "count": 2, "model": "builtin:tiny"}
    if init is not None:
        node["init"] = init
    run = scenario(
        rounds=4,
        defaults={
            "sapo": {"local_groups": 2, "external_groups": 2},
            "sampler": {"group_size": 4, "max_new_tokens": 3},
            "train": train,
        },
        nodes=[node],
    )
    Simulation(run, None, 0, run_dir).run()
    return [r["train"] for n in ("t-0", "t-1") for r in records(run_dir, n)]


def test_peers_sampled_ids_cross_the_wire_and_are_trained_as_sampled(tmp_path: Path) -> None:
    """`train.peer_tokens = "as_sampled"`: every peer completion trained in a run of real
    tiny-model nodes came with its sampled ids (protocol 5), decoded to its text and was
    trained on them; the default re-tokenizes (the tiny model's character tokenizer has
    one split per text, so both train the same tokens here)."""
    trained = {}
    for mode in ("as_sampled", "retokenized"):
        # One base for both (one model family): ids travel only within a family.
        lines = _two_tiny_nodes_steps(
            tmp_path / mode, {"peer_tokens": mode, "foreign_trajectory": "whole"}, "shared"
        )
        peers = sum(t["n_peer_ratio_one"] for t in lines)
        trained[mode] = (peers, sum(t["n_peer_as_sampled"] for t in lines))
        assert sum(t["n_peer_ids_refused"] for t in lines) == 0
    assert trained["as_sampled"][0] > 0 and trained["as_sampled"][1] == trained["as_sampled"][0]
    assert trained["retokenized"][1] == 0


def test_only_peers_completions_above_their_group_mean_are_trained_when_asked(
    tmp_path: Path,
) -> None:
    """`train.peer_advantages = "positive"` in a run of real tiny-model nodes: peers'
    completions reach the trainer, those above their group's mean are trained and the
    others are counted out; the default trains both kinds."""
    counts = {}
    for advantages in ("positive", "all"):
        lines = _two_tiny_nodes_steps(
            tmp_path / advantages, {"peer_advantages": advantages, "foreign_trajectory": "text"}
        )
        counts[advantages] = (
            sum(t["n_peer_ratio_one"] for t in lines),
            sum(t["n_peer_negative"] for t in lines),
        )
    assert counts["positive"][0] > 0 and counts["positive"][1] > 0
    assert counts["all"][0] > counts["positive"][0] and counts["all"][1] == 0
