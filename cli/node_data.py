"""`swarm status`, `swarm samples` and `swarm export`: commands that read what a node
wrote to its data dir (metrics, samples, checkpoints) and never start one.

Parsing and printing only, as the rest of `cli/`: the readers live in `node.progress`,
`node.samples` and `policy.export`. A missing or wrong path is a `ConfigError` (one
`error:` line, `cli.shell.user_errors`), never a traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli.shell import console, user_errors
from swarm.config import load_config
from swarm.errors import ConfigError


def _node_dir(path: Path) -> Path:
    """A node's data dir given either that dir or the node's config file (its
    `node.data_dir`); a clear error for any other file."""
    if path.is_file():
        if path.suffix != ".toml":
            raise ConfigError(f"{path}: a file; give a node's data_dir or its config file")
        return Path(load_config(path).node.data_dir)
    return path


@user_errors
def status(
    data_dir: Annotated[
        Path, typer.Argument(help="A node's data dir (holds metrics.jsonl), or its config file.")
    ],
    last: Annotated[int, typer.Option(help="Average over the last N rounds.")] = 10,
) -> None:
    """Summarize a running or finished node from its metrics."""
    from node.progress import status_table

    console.print(status_table(_node_dir(data_dir), last))


@user_errors
def export(
    run: Annotated[
        Path, typer.Argument(help="A node's data dir (newest checkpoint) or one checkpoint dir.")
    ],
    out: Annotated[Path, typer.Argument(help="Folder to write (a Hugging Face model folder).")],
    dtype: Annotated[
        str | None,
        typer.Option(help="Cast weights: float32 | bfloat16 | float16 (default: as trained)."),
    ] = None,
    force: Annotated[bool, typer.Option(help="Overwrite an existing folder.", metavar="")] = False,
) -> None:
    """Export a checkpoint as a model folder `from_pretrained` loads (no optimizer state)."""
    from node import checkpoints
    from policy.checkpoint import CheckpointError
    from policy.export import export_hf

    given = (run / "manifest.json").is_file()
    candidates = [run] if given else checkpoints.valid_newest_first(run)
    if not candidates:
        raise ConfigError(
            f"{run}: no valid checkpoint (give a node's data_dir or a checkpoint dir)"
        )
    for checkpoint in candidates:
        try:
            export_hf(checkpoint, out, dtype, overwrite=force)
        except CheckpointError as exc:
            if given or checkpoint == candidates[-1]:
                raise ConfigError(str(exc)) from None
            console.print(f"skipping {exc}; trying an older checkpoint", soft_wrap=True)
            continue
        except (FileExistsError, ValueError, OSError) as exc:
            raise ConfigError(str(exc)) from None
        break
    console.print(f"exported {checkpoint} -> {out}", soft_wrap=True, highlight=False)


@user_errors
def samples(
    data_dir: Annotated[
        Path, typer.Argument(help="A node's data dir (holds samples.jsonl), or its config file.")
    ],
    last: Annotated[int, typer.Option(help="Show the last N groups.")] = 3,
) -> None:
    """Show recent completions with their rewards (from `<data_dir>/samples.jsonl`)."""
    from node.samples import read_samples

    data_dir = _node_dir(data_dir)
    records = read_samples(data_dir / "samples.jsonl", last)
    if not records:
        raise ConfigError(
            f"{data_dir}: no samples.jsonl yet (is this a node's data_dir? "
            "node.samples_keep = 0 writes none)"
        )
    for record in records:
        task = record["task"]
        console.print(
            f"[bold]round {record['round']} v{record['policy_version']}[/bold]  "
            f"{task['source']} seed {task['seed']} #{task['index']}",
            highlight=False,
        )
        console.print(f"  prompt: {record['prompt']!r}", markup=False, highlight=False)
        finished = record.get("finished") or [None] * len(record["completions"])
        for text, reward, done in zip(
            record["completions"], record["rewards"], finished, strict=True
        ):
            end = "" if done is None else (" [EOS]" if done else " [cut]")
            console.print(f"  {reward:6.3f}  {text!r}{end}", markup=False, highlight=False)
