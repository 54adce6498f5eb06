"""Which task sources a node may use: a checked-in, measured table (no probing at load).

A task source is usable only if it is deterministic across processes (the same reference
gives the same question and answer on every machine, whatever `PYTHONHASHSEED`) and
bounded in time. `TaskSpec.source` is checked against this table at config load, and
`rewards.rg` serves only the datasets it marks usable (so peers' groups for a refused
source are refused too, without blaming the peer when our own generator is at fault).

Invariants:
- Pure data plus two lookups; imports nothing of ours (the config package is the core).
- Every dataset of the pinned reasoning-gym (`RG_VERSION`) is in exactly one of
  `RG_LAZY`, `RG_SIZED`, `RG_REFUSED` (a test checks this against the installed package):
  a dataset added by a newer reasoning-gym is refused until it has been measured.
- The reasoning-gym part is measured by `benchmarks/task_sources.py` (see there for how),
  which prints these constants; re-run it after changing the reasoning-gym pin.
"""

from __future__ import annotations

from typing import Literal

RefusalKind = Literal["nondeterministic", "slow", "broken", "hang", "unmeasured"]

BUILTIN_SOURCES: frozenset[str] = frozenset({"add", "copy", "reverse", "compare", "digit"})
"""The built-in generators of `rewards.tasks` (string-seeded RNG: deterministic, and each
item takes microseconds). A test checks this equals `rewards.tasks.BUILTIN_SOURCES`."""

RG_PREFIX = "rg:"
RG_VERSION = "0.1.25"
"""The reasoning-gym version the table was measured on (pinned in pyproject.toml)."""

RG_MAX_INDEX = 2**31 - 2
"""Largest index of a `lazy` reasoning-gym dataset (built at size 2**31-1)."""

# --- measured: see the end of this module (replaced by benchmarks/task_sources.py) ----

RG_LAZY: frozenset[str] = frozenset(
    {
        "ab",
        "advanced_geometry",
        "aiw",
        "arc_1d",
        "arc_agi",
        "base_conversion",
        "basic_arithmetic",
        "bf",
        "binary_alternation",
        "binary_matrix",
        "bitwise_arithmetic",
        "boxnet",
        "caesar_cipher",
        "calendar_arithmetic",
        "chain_sum",
        "circuit_logic",
        "coin_flip",
        "color_cube_rotation",
        "complex_arithmetic",
        "count_bits",
        "count_primes",
        "countdown",
        "course_schedule",
        "cryptarithm",
        "decimal_arithmetic",
        "decimal_chain_sum",
        "dice",
        "emoji_mystery",
        "family_relationships",
        "figlet_font",
        "fraction_simplification",
        "game_of_life",
        "gcd",
        "graph_color",
        "group_anagrams",
        "intermediate_integration",
        "jugs",
        "kakurasu",
        "knights_knaves",
        "largest_island",
        "lcm",
        "leg_counting",
        "letter_counting",
        "letter_jumble",
        "mahjong_puzzle",
        "manipulate_matrix",
        "maze",
        "mini_sudoku",
        "modulo_grid",
        "n_queens",
        "needle_haystack",
        "number_filtering",
        "number_format",
        "number_sorting",
        "palindrome_generation",
        "palindrome_partitioning",
        "path_star",
        "polynomial_equations",
        "pool_matrix",
        "power_function",
        "prime_factorization",
        "products",
        "propositional_logic",
        "puzzle24",
        "quantum_lock",
        "rearc",
        "rectangle_count",
        "rotate_matrix",
        "rotten_oranges",
        "rubiks_cube",
        "rush_hour",
        "self_reference",
        "sentence_reordering",
        "shortest_path",
        "simple_equations",
        "simple_geometry",
        "simple_integration",
        "spell_backward",
        "spiral_matrix",
        "string_insertion",
        "string_manipulation",
        "string_splitting",
        "string_synthesis",
        "sudoku",
        "survo",
        "syllogism",
        "time_intervals",
        "tower_of_hanoi",
        "tsumego",
        "word_sequence_reversal",
        "word_sorting",
        "zebra_puzzles",
    }
)
RG_SIZED: dict[str, int] = {
    "acre": 999,
    "gsm_symbolic": 9999,
}
RG_REFUSED: dict[str, tuple[RefusalKind, str]] = {
    "codeio": ("nondeterministic", "differs between two processes"),
    "composite": ("broken", "every probe raises AssertionError"),
    "futoshiki": ("slow", "seed 897, index 0 took 2.3 s"),
    "game_of_life_halting": ("broken", "its scorer gives 1.0 to any non-empty answer"),
    "isomorphic_strings": ("nondeterministic", "depends on PYTHONHASHSEED"),
    "knight_swap": ("nondeterministic", "depends on PYTHONHASHSEED"),
    "list_functions": ("nondeterministic", "differs between two processes"),
    "number_sequence": ("slow", "seed 4294967296, index 382 took 11.2 s"),
    "polynomial_multiplication": ("nondeterministic", "depends on PYTHONHASHSEED"),
    "ransom_note": ("nondeterministic", "depends on PYTHONHASHSEED"),
    "sokoban": ("slow", "up to 0.7 s per probed item; fuzzing found items over 1 s"),
    "word_ladder": ("broken", "every probe raises ValueError"),
}

# --- lookups ---------------------------------------------------------------------------


def rg_refusal(dataset: str) -> tuple[RefusalKind, str] | None:
    """None if `dataset` is usable, else (kind, why) from the table; a dataset missing
    from the table is `unmeasured`."""
    if dataset in RG_LAZY or dataset in RG_SIZED:
        return None
    if dataset in RG_REFUSED:
        return RG_REFUSED[dataset]
    return (
        "unmeasured",
        f"not in the table measured on reasoning-gym {RG_VERSION} "
        "(measure it with benchmarks/task_sources.py)",
    )


def check_task_source(name: str) -> None:
    """Raise `ValueError` naming the source, why it is refused and the fix, unless `name`
    is a built-in source or a usable `rg:<dataset>`."""
    if name in BUILTIN_SOURCES:
        return
    if not name.startswith(RG_PREFIX):
        raise ValueError(
            f"unknown task source {name!r}: use a built-in source "
            f"({', '.join(sorted(BUILTIN_SOURCES))}) or 'rg:<dataset>'"
        )
    dataset = name[len(RG_PREFIX) :]
    refusal = rg_refusal(dataset)
    if refusal is None:
        return
    kind, why = refusal
    raise ValueError(
        f"task source {name!r} is refused ({kind}): {why}. Remove it from the task mixture "
        f"or pick a usable dataset (rewards.tasks.known_sources() lists them; "
        f"swarm.config.task_sources has the measured table)"
    )


OPTION_VALUE_TYPES = (bool, int, float, str)


def check_task_options(name: str, options: dict[str, object]) -> None:
    """Raise `ValueError` naming the bad key and the allowed ones, unless `options` are
    valid settings of reasoning-gym dataset `name` (built-in sources take none). Options
    are JSON scalars or lists of them; `seed` and `size` are the swarm's to choose."""
    if not options:
        return
    if not name.startswith(RG_PREFIX):
        raise ValueError(f"task source {name!r} takes no options (only 'rg:' datasets do)")
    for key, value in options.items():
        items = value if isinstance(value, list) else [value]
        if not all(isinstance(v, OPTION_VALUE_TYPES) for v in items):
            raise ValueError(f"option {key!r}: use numbers, strings, booleans or lists of them")
    import dataclasses

    import reasoning_gym.factory as factory  # only when options are given: it is slow

    dataset = name[len(RG_PREFIX) :]
    _, config_class = factory.DATASETS[dataset]
    allowed = sorted(
        f.name for f in dataclasses.fields(config_class) if f.name not in ("seed", "size")
    )
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"{name}: unknown option(s) {unknown}; allowed: {', '.join(allowed)}")
    try:
        config_class(**options, seed=0, size=1).validate()
    except (AssertionError, ValueError, TypeError) as exc:
        raise ValueError(f"{name}: options rejected by reasoning-gym: {exc}") from None
