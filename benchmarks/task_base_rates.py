"""A base model's held-out score on each task source, with the node's prompt: which sources
a real-model experiment can learn on (issue 33 wants 5-40% at the start).

For every source named, the held-out set a node would draw (`[eval] num_tasks` references
of one held-out seed, default options) is answered by the base model, greedily and with
`--samples` sampled completions per task at the sampler's temperature, through the
node's own `PolicyLearner.evaluate` (the chat template, system prompt and two solved
examples a node sends). One model load serves every source. Prints a table (and writes
`--json`); sources inside the band are marked, as `guessable` where one answer given to
every task (`const`) already scores the band's low edge: there a rising held-out score
can be a guess learned (`docs/real_swarm.md`). `const` is scored by the node's own
correctness (`rewards.registry.best_constant`: the best of the set's gold answers given
to every task), so partial credit counts. `mode`: the share of the
base's greedy answers that are its most common one. `--constants-only` prints `const` and
that answer without loading a model (about a second per source).

    .venv/bin/python benchmarks/task_base_rates.py --model .cache/smollm2-135m-instruct \
        --sources rg:gcd,rg:lcm,rg:count_bits --tasks 32 --samples 4 --max-new-tokens 24

Wall time: about 1-3 s per task greedy on 2 CPU cores for SmolLM2-135M at 24 tokens.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from node.evaluation import answer_stats, held_out_sets
from swarm.config import parse_config

DEFAULT_SOURCES = (
    "rg:gcd,rg:lcm,rg:count_bits,rg:leg_counting,rg:letter_counting,rg:number_format,"
    "rg:power_function,rg:prime_factorization,rg:products,rg:simple_equations,"
    "rg:base_conversion,rg:bitwise_arithmetic,rg:count_primes,rg:decimal_arithmetic,"
    "rg:fraction_simplification,rg:spell_backward,rg:number_sorting,rg:coin_flip,rg:aiw,"
    "rg:family_relationships,rg:time_intervals,rg:simple_geometry,rg:basic_arithmetic,"
    "rg:chain_sum,rg:dice,rg:letter_jumble"
)


def node_config(model: str, sources: list[str], args: argparse.Namespace, data_dir: str) -> Any:
    """The node config a real-model experiment uses, scoring `sources` apart (with
    `--options`: one source, drawn with those dataset options, scored as its mixture)."""
    options = json.loads(args.options) if args.options else None
    if options is not None and len(sources) != 1:
        raise ValueError("--options applies to one source at a time")
    tasks: dict[str, Any] = {"mixture": [{"source": sources[0]}], "seed": args.seed}
    evaluation: dict[str, Any] = {"every": 1, "num_tasks": args.tasks, "sources": sources}
    if options is not None:
        tasks["mixture"][0]["options"] = options
        del evaluation["sources"]
    return parse_config(
        {
            "node": {"name": "base-rates", "data_dir": data_dir},
            "transport": {"type": "memory"},
            "model": {
                "name_or_path": model,
                "threads": args.threads,
                "seed": args.seed,
                "lora": {"enabled": True, "rank": 16, "alpha": 32.0},
            },
            "sampler": {"group_size": 8, "max_new_tokens": args.max_new_tokens},
            "rewards": {"format_weight": 0.0},
            "prompt": {"few_shot": args.few_shot},
            "tasks": tasks,
            "eval": evaluation,
        },
        "task_base_rates",
    )


def print_constants(args: argparse.Namespace, sources: list[str]) -> None:
    """`const` per source on the same held-out sets, and the answer that scores it."""
    from rewards.registry import best_constant
    from rewards.tasks import make_task

    with tempfile.TemporaryDirectory() as data_dir:
        config = node_config(args.model, sources, args, data_dir)
        print(f"{'source':<28} {'const':>6}  answer")
        for source, refs in held_out_sets(config).items():
            best = best_constant([make_task(r) for r in refs], config.rewards)
            shown = "-" if best is None else f"{best[1]:>6.3f}  {best[0][:60]!r}"
            print(f"{source:<28} {shown}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=".cache/smollm2-135m-instruct")
    parser.add_argument("--sources", default=DEFAULT_SOURCES, help="comma-separated")
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--samples", type=int, default=4, help="0: greedy only")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0, help="model and task seed (held-out set)")
    parser.add_argument("--band", default="0.05,0.40", help="low,high of the wanted base rate")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--few-shot", type=int, default=2, help="solved examples per prompt")
    parser.add_argument("--constants-only", action="store_true", help="no model: const only")
    parser.add_argument(
        "--options",
        help="reasoning-gym dataset options as JSON (e.g. '{\"max_terms\": 2}'): one source",
    )
    args = parser.parse_args()
    sources = [s.strip() for s in args.sources.split(",") if s.strip()]
    low, high = (float(x) for x in args.band.split(","))
    if args.options:
        print(f"{sources[0]} with options {args.options} (its held-out set: 'mixture')")
    if args.constants_only:
        print_constants(args, sources)
        return

    from node.policy_learner import PolicyLearner  # torch: after argument errors

    with tempfile.TemporaryDirectory() as data_dir:
        config = node_config(args.model, sources, args, data_dir)
        learner = PolicyLearner(config)
        sets = held_out_sets(config)
        rows: list[dict[str, Any]] = []
        print(
            f"{'source':<28} {'greedy':>7} {'sampled':>8} {'ended':>6} {'const':>6} "
            f"{'mode':>5} {'s':>6}  band"
        )
        for source, refs in sets.items():
            start = time.perf_counter()
            greedy = learner.evaluate(refs, args.max_new_tokens, 0)
            sampled = (
                learner.evaluate(refs, args.max_new_tokens, args.samples) if args.samples else None
            )
            seconds = time.perf_counter() - start
            stats = answer_stats(greedy)
            row = {
                "source": source,
                "greedy": greedy.accuracy,
                "sampled": sampled.accuracy if sampled else None,
                "finished": greedy.finished,
                "constant": stats.get("constant_answer_accuracy", 0.0),
                "modal_answer_share": stats.get("modal_answer_share", 0.0),
                "seconds": round(seconds, 1),
            }
            rows.append(row)
            rate = row["sampled"] if row["sampled"] is not None else row["greedy"]
            inside = "yes" if low <= rate <= high and low <= greedy.accuracy <= high else ""
            if inside and row["constant"] >= low:
                inside = "guessable"  # a constant answer alone reaches the band
            shown = f"{row['sampled']:.3f}" if row["sampled"] is not None else "-"
            print(
                f"{source:<28} {greedy.accuracy:>7.3f} {shown:>8} {greedy.finished:>6.2f} "
                f"{row['constant']:>6.3f} {row['modal_answer_share']:>5.2f} {seconds:>6.1f}"
                f"  {inside}",
                flush=True,
            )
    if args.json:
        args.json.write_text(
            json.dumps({"args": vars(args) | {"json": str(args.json)}, "rows": rows}, indent=1)
        )


if __name__ == "__main__":
    main()
