"""Wire attackers in simnet: each behaviour is refused for its reason, attributable ones
get their keys ignored, and the honest nodes finish every round and keep learning."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from node.metrics import read_metrics
from simnet import attackers
from simnet.engine import Simulation
from simnet.scenario import ATTACK_BEHAVIORS
from tests.simnet.helpers import scenario

EXPECTED: dict[str, tuple[str, ...]] = {
    "garbage": ("malformed", "oversize"),
    "wrong_swarm": ("wrong_swarm", "ignored_peer"),
    "replay": ("duplicate",),
    "flood": ("rate_limited", "ignored_peer"),
    "mismatched_prompt": ("prompt_mismatch", "ignored_peer"),
    "forged_rewards": ("forged_rewards", "ignored_peer"),
    "sybil": ("forged_rewards", "ignored_peer"),
    "silent_mid_chunk": ("reassembly_expired",),
    # Its claims are what receivers recompute; its signal is all in unfinished completions.
    "signal_bait": ("no_trainable_signal",),
    "signal_bait_ended": (),  # nothing to refuse: it teaches correct answers that end
    "signal_bait_farmed": (),  # honest peers' work re-signed, then the bait above
    "offpolicy_correct": (),  # another model's correct answers: nothing to refuse
}
ATTRIBUTABLE = {"wrong_swarm", "flood", "mismatched_prompt", "forged_rewards", "sybil"}


def attacked(behavior: str, rounds: int = 16) -> Any:
    return scenario(
        rounds=rounds,
        defaults={
            "sapo": {"local_groups": 2, "external_groups": 2, "max_staleness": 2},
            "sampler": {"group_size": 4},
            "gossip": {
                "rate_limit_per_s": 5.0,
                "rate_burst": 20,
                "reassembly_timeout_s": 10.0,
            },
        },
        network={"max_message_bytes": 16 * 1024},
        nodes=[
            {"name": "n", "count": 4, "model": "stub", "stub": {"skill": 0.3, "rate": 0.01}},
            {
                "name": "evil",
                "behavior": behavior,
                "hostile": {"every_s": 2.0, "flood_messages": 40, "sybil_keys": 6},
            },
        ],
    )


def test_the_scenario_schema_knows_every_attack() -> None:
    assert set(ATTACK_BEHAVIORS) == set(attackers.ATTACK_BEHAVIORS) == set(EXPECTED)


@pytest.mark.parametrize("behavior", sorted(EXPECTED))
def test_each_attack_is_refused_for_its_reason(behavior: str, tmp_path: Path) -> None:
    summary = Simulation(attacked(behavior), None, 0, tmp_path).run()
    (attacker,) = summary["attackers"]
    assert attacker["behavior"] == behavior and attacker["messages_sent"] > 10
    assert len(summary["nodes"]) == 4  # the attacker is not among the learning nodes
    for node in summary["nodes"]:
        assert node["rounds_done"] == 16
        drops = node["drops_last_incarnation"]
        assert drops.get("internal_error", 0) == 0
        for reason in EXPECTED[behavior]:
            assert drops.get(reason, 0) >= 1, (behavior, reason, drops)
        if behavior in ATTRIBUTABLE:
            assert node["peer_scores_last_incarnation"]["ignores_started"] >= 1
        # Absurd version claims (sybil: 2**62) can only age the claimant's own groups.
        assert drops.get("stale_version", 0) == 0
        assert node["external_per_round"] >= 1.5  # honest sharing goes on (2 per round)


def test_a_forger_is_ignored_then_forgiven_then_ignored_longer(tmp_path: Path) -> None:
    run = attacked("forged_rewards", rounds=30)
    data = run.model_dump()
    data["defaults"]["gossip"]["scoring"] = {"ignore_s": 20.0, "max_ignore_s": 80.0}
    summary = Simulation(type(run).model_validate(data), None, 0, tmp_path).run()
    for node in summary["nodes"]:
        scores = node["peer_scores_last_incarnation"]
        assert scores["ignores_started"] >= 2 and scores["forgiven"] >= 1


@pytest.mark.parametrize("rule", ["ended", "text"])
def test_signal_bait_takes_external_slots_only_where_unfinished_text_is_trained(
    rule: str, tmp_path: Path
) -> None:
    """Groups whose claimed rewards are exactly what receivers recompute, with the largest
    reward spread, win the `signal` rule's slots and are blamed on nobody. Under the
    `text` rule (the earlier default) they are trained and teach nodes to never stop
    (docs/sapo_grid.md); under `ended` (the default) their completions, which never
    ended, are not trainable, so the groups are dropped on arrival and take no slot."""
    run = attacked("signal_bait")
    data = run.model_dump()
    data["defaults"]["sapo"]["external_selection"] = "signal"
    data["defaults"].setdefault("train", {})["foreign_trajectory"] = rule
    summary = Simulation(type(run).model_validate(data), None, 0, tmp_path).run()
    bait = set(summary["attackers"][0]["peer_ids"])
    assert len(bait) == 6
    for node in summary["nodes"]:
        records = read_metrics(tmp_path / node["name"] / "metrics.jsonl")
        from_bait = sum(n for r in records for s, n in r["external_by_sender"].items() if s in bait)
        dropped = node["drops_last_incarnation"].get("no_trainable_signal", 0)
        if rule == "text":
            assert from_bait >= len(records)  # most external slots go to the attacker
            assert dropped == 0
        else:
            assert from_bait == 0 and dropped >= len(records)
            assert node["external_per_round"] >= 1.5  # the slots go to honest peers
        assert node["peer_scores_last_incarnation"]["ignores_started"] == 0


@pytest.mark.parametrize("keys", [6, 60])
def test_a_late_wave_of_bait_keys_shares_one_cohort_budget(keys: int, tmp_path: Path) -> None:
    """Issue 35: `signal_bait_ended` (nothing to refuse) arriving after the honest nodes
    with 6 or 60 keys. Without arrival cohorts its keys take almost every external slot
    of a signal node; with them (the default) the wave is one cohort whose draw weight
    grows with its age, so its share stays well below, whatever the number of keys (it
    still fills slots no honest group is left for: measured 0.40-0.45 against 0.86-0.88)."""
    share = {}
    for cohort_rounds in (0, 4):
        run = attacked("signal_bait_ended", rounds=40)
        data = run.model_dump()
        data["defaults"]["sapo"].update(
            external_selection="signal", cohort_rounds=cohort_rounds, cohort_ramp_rounds=32
        )
        evil = data["nodes"][1]
        evil["join_s"] = 40.0  # about round 8 of a stub node
        evil["hostile"]["sybil_keys"] = keys
        out = tmp_path / str(cohort_rounds)
        summary = Simulation(type(run).model_validate(data), None, 0, out).run()
        bait = set(summary["attackers"][0]["peer_ids"])
        taken = used = 0
        for node in summary["nodes"]:
            for r in read_metrics(out / node["name"] / "metrics.jsonl"):
                if r["time"] >= 40.0:
                    used += sum(r["external_by_sender"].values())
                    taken += sum(n for s, n in r["external_by_sender"].items() if s in bait)
        share[cohort_rounds] = taken / used
    assert share[0] > 0.8, share
    assert share[4] < share[0] - 0.3, share


def test_bait_keys_there_from_the_start_share_one_network_turn(tmp_path: Path) -> None:
    """Issue 35: `signal_bait_ended` with 6 keys from the swarm's first round shares the
    honest nodes' arrival cohort, so cohorts cannot bound it. Its keys are seen at one
    network (simnet's stand-in for the address of a direct connection); with
    `networks_first` they share one turn, one of a node's 2 external slots a round while
    its 3 honest peers offer groups. Keys at 6 networks (an address block each) are not
    bounded: what the defence costs an attacker is address blocks, not keys."""
    share = {}
    for networks_first, blocks in ((False, 1), (True, 1), (True, 6)):
        run = attacked("signal_bait_ended", rounds=24)
        data = run.model_dump()
        data["defaults"]["sapo"].update(external_selection="signal", networks_first=networks_first)
        data["nodes"][1]["hostile"]["sybil_networks"] = blocks
        out = tmp_path / f"{networks_first}-{blocks}"
        summary = Simulation(type(run).model_validate(data), None, 0, out).run()
        bait = set(summary["attackers"][0]["peer_ids"])
        taken = used = 0
        for node in summary["nodes"]:
            for r in read_metrics(out / node["name"] / "metrics.jsonl"):
                used += sum(r["external_by_sender"].values())
                taken += sum(n for s, n in r["external_by_sender"].items() if s in bait)
        share[networks_first, blocks] = taken / used
    assert share[False, 1] > 0.8, share
    assert share[True, 1] <= 0.5, share
    assert share[True, 6] > 0.8, share
