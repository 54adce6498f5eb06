"""Export a checkpoint as a plain Hugging Face model folder.

Invariants:
- The output holds exactly what `from_pretrained` needs: config.json,
  generation_config.json (when the model has one), the tokenizer files and
  `model.safetensors`; never optimizer state, RNG state or swarm bookkeeping.
- The checkpoint's tensor files are verified (size and sha256) before anything is read.
- Without `dtype`, the weights are the checkpoint's, bit for bit; with it, floating-point
  tensors are cast and `config.json` says the new dtype.
- A LoRA checkpoint (`lora.json`) is exported merged (`policy.lora.merge_lora_tensors`):
  the base model's names and config, a plain model any loader takes.
- Written atomically: a hidden temporary sibling renamed into place; an existing `out`
  is refused unless `overwrite`.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from policy.checkpoint import MANIFEST, CheckpointError, read_manifest
from policy.lora import merge_lora_tensors
from policy.precision import DTYPES

NOT_EXPORTED = frozenset(
    {
        MANIFEST,
        "model.safetensors",  # written separately (copied, merged or cast)
        "optimizer.safetensors",
        "extra.safetensors",
        "node.json",
        "lora.json",
    }
)


def export_hf(
    checkpoint: Path, out: Path, dtype: str | None = None, overwrite: bool = False
) -> Path:
    """Write the model of `checkpoint` to `out` as a Hugging Face folder; returns `out`."""
    checkpoint, out = Path(checkpoint), Path(out)
    read_manifest(checkpoint)  # verifies the tensor files
    lora_file = checkpoint / "lora.json"
    lora = json.loads(lora_file.read_text()) if lora_file.is_file() else None
    config_dir = checkpoint / "base_config" if lora is not None else checkpoint
    if not (config_dir / "config.json").is_file():
        raise CheckpointError(
            f"{checkpoint}: no config.json (written by an older swarm that did not save "
            "model files); train one more checkpoint with this version, then export"
        )
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out}: already exists; pass --force to overwrite it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        for path in [*checkpoint.iterdir(), *config_dir.iterdir()]:
            if path.is_file() and path.name not in NOT_EXPORTED:
                shutil.copy2(path, tmp / path.name)
        if dtype is None and lora is None:
            shutil.copy2(checkpoint / "model.safetensors", tmp / "model.safetensors")
        else:
            tensors = load_file(str(checkpoint / "model.safetensors"))
            if lora is not None:
                tensors = merge_lora_tensors(tensors, float(lora["scaling"]))
            if dtype is not None:
                target = DTYPES[dtype]
                tensors = {
                    k: v.to(target) if v.is_floating_point() else v for k, v in tensors.items()
                }
            save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        if dtype is not None:
            config = json.loads((tmp / "config.json").read_text())
            config["dtype"] = dtype
            config.pop("torch_dtype", None)
            (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def exported_dtype(out: Path) -> torch.dtype:
    """The dtype of the first floating tensor of an exported folder (for checks)."""
    for tensor in load_file(str(Path(out) / "model.safetensors")).values():
        if tensor.is_floating_point():
            return tensor.dtype
    raise ValueError(f"{out}: no floating-point tensors")
