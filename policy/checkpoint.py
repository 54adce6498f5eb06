"""Atomic safetensors checkpoints of model + optimizer (+ extra tensors and a manifest).

Layout of one checkpoint directory (also a Hugging Face model folder):
    model.safetensors      model tensors (one copy per shared storage, e.g. tied embeddings,
                           as `save_pretrained` writes them), metadata format "pt"
    config.json, generation_config.json, tokenizer files
                           written by the model's / tokenizer's `save_pretrained` (when a
                           tokenizer is given): `AutoModelForCausalLM.from_pretrained(dir)`
                           and `AutoTokenizer.from_pretrained(dir)` load a checkpoint.
                           A LoRA model (`policy.lora`) writes instead `base_config/`
                           (the base model's config), `lora.json` and `adapter/` (the
                           adapter as PEFT saves it); `swarm export` merges it.
    optimizer.safetensors  optimizer state tensors, keys `state.<param index>.<name>`
                           (empty when saved without optimizer state)
    extra.safetensors      the caller's extra tensors (RNG states, error-feedback residuals)
    manifest.json          format tag, the caller's manifest, optimizer param groups and
                           non-tensor state, tensor aliases, and size + sha256 of each file

Invariants:
- No pickle anywhere: tensors are safetensors, everything else JSON.
- A checkpoint is `capture_checkpoint` (copies of every tensor, taken at once) then
  `write_checkpoint`, which may run later in another thread: what is written is the state
  at capture. The config and tokenizer files of a full model are written by
  `write_checkpoint` too (training never changes them: capture stays a memory copy); a
  LoRA adapter's files hold trained weights, so they are written at capture. Writing
  goes into a hidden temporary sibling directory, fsyncs every file and the directory,
  then renames it into place (replacing an older checkpoint of the same name): a reader
  sees the old checkpoint or the new one, never a mix.
- A failed write (disk full, quota, file too large, I/O error) raises `OSError` with the
  errno, from our own writes and from safetensors' (whose Rust errors are translated), and
  leaves no temporary directory behind; an older checkpoint of the same name is kept.
- `load_checkpoint` verifies every tensor file's size and sha256 before touching the
  model, and restores model and optimizer exactly (bit-for-bit tensors, param groups, step
  counts). A checkpoint saved without optimizer state leaves the optimizer as it is
  (fresh moments) and says so in the log.
- `latest_valid_checkpoint` ignores hidden (temporary) directories and any directory
  whose manifest is missing, unparsable, of another format, or whose files are missing or
  do not match their recorded size and hash (torn or incomplete checkpoints).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import random
import re
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

log = logging.getLogger(__name__)

FORMAT = "swarm-checkpoint/1"
MANIFEST = "manifest.json"
FILES = ("model.safetensors", "optimizer.safetensors", "extra.safetensors")


class CheckpointError(ValueError):
    """A checkpoint that is torn, tampered with, or does not fit the model/optimizer."""


_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def _save_tensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """`save_file`, with its I/O failures raised as `OSError` (errno kept) like ours."""
    try:
        save_file(tensors, str(path), metadata={"format": "pt"})
    except SafetensorError as exc:
        found = _OS_ERROR.search(str(exc))
        if found is None:
            raise  # not an I/O failure: a bug, not a full disk
        code = int(found.group(1))
        raise OSError(code, os.strerror(code), str(path)) from exc


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync_file(path: Path) -> None:
    with path.open("rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy(t: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU copy that later changes to `t` cannot reach."""
    return t.detach().to("cpu", copy=True).contiguous()


def _model_tensors(model: torch.nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(unique tensors, alias -> saved name) for tensors sharing storage (tied weights)."""
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple[int, int, tuple[int, ...]], str] = {}
    for name, t in model.state_dict().items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if key in seen:
            aliases[name] = seen[key]
        else:
            seen[key] = name
            tensors[name] = _copy(t)
    return tensors, aliases


def _json_value(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_json_value(v) for v in value]
    if isinstance(value, list):
        return [_json_value(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"optimizer value of type {type(value).__name__} is not JSON-serializable")


def _optimizer_parts(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    sd = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, Any] = {}
    for pid, state in sd["state"].items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{pid}.{key}"] = _copy(value)
            else:
                scalars[f"{pid}.{key}"] = _json_value(value)
    groups = [{k: _json_value(v) for k, v in g.items()} for g in sd["param_groups"]]
    return tensors, {"param_groups": groups, "scalars": scalars}


def _write_model_files(tmp: Path, model: Any, tokenizer: Any, lora: dict | None) -> None:
    """config.json, generation_config.json and the tokenizer, as `save_pretrained` does
    (for a LoRA model: base_config/, lora.json and adapter/)."""
    config_dir = tmp / "base_config" if lora is not None else tmp
    config_dir.mkdir(exist_ok=True)
    base = model.get_base_model() if lora is not None else model
    config = getattr(base, "config", None)
    if config is not None:
        config.save_pretrained(config_dir)
    generation = getattr(base, "generation_config", None)
    if generation is not None:
        generation.save_pretrained(config_dir)
    tokenizer.save_pretrained(tmp)
    if lora is not None:
        (tmp / "lora.json").write_text(json.dumps(lora, indent=1, sort_keys=True))
        model.save_pretrained(tmp / "adapter")


@dataclass
class CheckpointImage:
    """A checkpoint captured in memory (tensors copied out of the live model and
    optimizer; a LoRA adapter's files already in the hidden temporary directory): writing it
    (`write_checkpoint`) can run in a background thread while training changes the
    model. An image that is never written leaves a hidden temporary directory, which
    `node.checkpoints.prune` removes."""

    directory: Path
    tmp: Path
    payloads: dict[str, dict[str, torch.Tensor]]
    doc: dict[str, Any]
    model_files: Callable[[], None] | None = None
    """Writes config, generation config and tokenizer files into `tmp` (deferred to the
    write: they do not change while the model trains)."""


def capture_checkpoint(
    directory: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    extra_tensors: dict[str, torch.Tensor],
    manifest: dict[str, Any],
    tokenizer: Any = None,
    lora: dict[str, Any] | None = None,
) -> CheckpointImage:
    """Copy what a checkpoint of `directory` holds (costs one copy of model + optimizer
    state in memory until written); with a `tokenizer`, it is also a Hugging Face model
    folder; with `optimizer=None`, it holds no optimizer state."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = directory.parent / f".{directory.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    model_files = None
    try:
        if tokenizer is not None and lora is None:
            model_files = functools.partial(_write_model_files, tmp, model, tokenizer, None)
        elif tokenizer is not None:
            _write_model_files(tmp, model, tokenizer, lora)
        model_tensors, aliases = _model_tensors(model)
        opt_tensors, opt_meta = _optimizer_parts(optimizer) if optimizer is not None else ({}, None)
        payloads = {
            "model.safetensors": model_tensors,
            "optimizer.safetensors": opt_tensors,
            "extra.safetensors": {k: _copy(v) for k, v in extra_tensors.items()},
        }
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    doc = {"format": FORMAT, "manifest": manifest, "optimizer": opt_meta, "aliases": aliases}
    return CheckpointImage(directory, tmp, payloads, doc, model_files)


def write_checkpoint(image: CheckpointImage) -> None:
    """Write a captured checkpoint atomically at its directory (see the module docstring)."""
    tmp, directory = image.tmp, image.directory
    try:
        if image.model_files is not None:
            image.model_files()
        files = {}
        for name, tensors in image.payloads.items():
            path = tmp / name
            _save_tensors(tensors, path)
            _fsync_file(path)
            files[name] = {"size": path.stat().st_size, "sha256": _sha256(path)}
        (tmp / MANIFEST).write_text(json.dumps({**image.doc, "files": files}, indent=1,
                                               sort_keys=True))  # fmt: skip
        _fsync_file(tmp / MANIFEST)
        for path in tmp.rglob("*"):  # the model files save_pretrained wrote
            if path.is_file() and path.name not in files and path.name != MANIFEST:
                _fsync_file(path)
        _fsync_dir(tmp)
        old = None
        if directory.exists():
            old = directory.parent / f".{directory.name}.old-{uuid.uuid4().hex[:8]}"
            directory.rename(old)
        tmp.rename(directory)
        _fsync_dir(directory.parent)
        if old is not None:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        image.payloads.clear()  # the copies are no longer needed


def _read_manifest(directory: Path, verify: bool = True) -> dict[str, Any]:
    try:
        doc = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{directory}: unreadable manifest ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CheckpointError(f"{directory}: not a {FORMAT} checkpoint")
    files = doc.get("files")
    if not isinstance(files, dict) or set(files) != set(FILES):
        raise CheckpointError(f"{directory}: manifest lists the wrong files")
    for name, meta in files.items():
        path = directory / name
        if not path.is_file() or path.stat().st_size != meta.get("size"):
            raise CheckpointError(f"{directory}: {name} is missing or has the wrong size")
        if verify and _sha256(path) != meta.get("sha256"):
            raise CheckpointError(f"{directory}: {name} does not match its hash")
    return doc


def read_manifest(directory: Path) -> dict[str, Any]:
    """The verified manifest document of a checkpoint (`CheckpointError` if torn)."""
    return _read_manifest(Path(directory))


def _restore_types(saved: Any, current: Any) -> Any:
    if isinstance(current, tuple) and isinstance(saved, list):
        return tuple(_restore_types(s, c) for s, c in zip(saved, current, strict=False))
    return saved


def load_checkpoint(
    directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Restore model (and optimizer) in place; returns (manifest, extra tensors)."""
    directory = Path(directory)
    doc = _read_manifest(directory)
    tensors = load_file(str(directory / "model.safetensors"))
    for alias, target in doc["aliases"].items():
        tensors[alias] = tensors[target]
    try:
        model.load_state_dict(tensors, strict=True)
    except RuntimeError as exc:
        raise CheckpointError(f"{directory}: model does not fit ({exc})") from exc
    if optimizer is not None and doc["optimizer"] is None:
        log.info("%s: saved without optimizer state; the optimizer starts fresh", directory)
    elif optimizer is not None:
        opt_tensors = load_file(str(directory / "optimizer.safetensors"))
        state: dict[int, dict[str, Any]] = {}
        for key, value in opt_tensors.items():
            _, pid, name = key.split(".", 2)
            state.setdefault(int(pid), {})[name] = value
        for key, value in doc["optimizer"]["scalars"].items():
            pid, name = key.split(".", 1)
            state.setdefault(int(pid), {})[name] = value
        current = optimizer.state_dict()["param_groups"]
        saved_groups = doc["optimizer"]["param_groups"]
        if len(saved_groups) != len(current):
            raise CheckpointError(f"{directory}: optimizer has a different number of groups")
        groups = [
            {k: _restore_types(v, cur.get(k)) for k, v in saved.items()}
            for saved, cur in zip(saved_groups, current, strict=True)
        ]
        try:
            optimizer.load_state_dict({"state": state, "param_groups": groups})
        except (ValueError, KeyError) as exc:
            raise CheckpointError(f"{directory}: optimizer does not fit ({exc})") from exc
    extra = load_file(str(directory / "extra.safetensors"))
    return doc["manifest"], extra


def latest_valid_checkpoint(root: Path, order_key: str = "step") -> Path | None:
    """The valid checkpoint under `root` with the largest integer `manifest[order_key]`
    (ties and missing keys ordered by directory name); None if there is none."""
    root = Path(root)
    if not root.is_dir():
        return None
    best: tuple[int, str] | None = None
    best_path = None
    for path in root.iterdir():
        if path.name.startswith(".") or not path.is_dir():
            continue
        try:
            doc = _read_manifest(path)
        except CheckpointError as exc:
            log.warning("ignoring checkpoint: %s", exc)
            continue
        value = doc["manifest"].get(order_key) if isinstance(doc["manifest"], dict) else None
        rank = (value if isinstance(value, int) and not isinstance(value, bool) else -1, path.name)
        if best is None or rank > best:
            best, best_path = rank, path
    return best_path


def rng_state_tensors() -> dict[str, torch.Tensor]:
    """Python, torch CPU and (if present) CUDA RNG states as tensors for `extra_tensors`."""
    version, internal, gauss = random.getstate()
    out = {
        "rng.python": torch.tensor([version, *internal], dtype=torch.int64),
        "rng.python_gauss": torch.tensor(
            [float("nan") if gauss is None else gauss], dtype=torch.float64
        ),
        "rng.torch": torch.random.get_rng_state(),
    }
    if torch.cuda.is_available():
        out["rng.cuda"] = torch.stack(torch.cuda.get_rng_state_all())
    return out


def restore_rng_state(tensors: dict[str, torch.Tensor]) -> None:
    """Inverse of `rng_state_tensors` (keys that are absent are left alone)."""
    if "rng.python" in tensors:
        values = [int(v) for v in tensors["rng.python"].tolist()]
        gauss = (
            float(tensors["rng.python_gauss"][0]) if "rng.python_gauss" in tensors else float("nan")
        )
        random.setstate((values[0], tuple(values[1:]), None if gauss != gauss else gauss))
    if "rng.torch" in tensors:
        torch.random.set_rng_state(tensors["rng.torch"])
    if "rng.cuda" in tensors and torch.cuda.is_available():
        states = list(tensors["rng.cuda"])
        if len(states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(states)
        else:
            log.warning(
                "checkpoint has %d CUDA RNG states for %d devices; not restored",
                len(states),
                torch.cuda.device_count(),
            )
