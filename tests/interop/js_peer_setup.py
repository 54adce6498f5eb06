"""Installing the js peer's npm packages (`tests/interop/js_peer`), for `make js-peer-deps`
and the interop test's fixture.

Invariants:
- Installs only with `npm ci`, i.e. exactly the versions in the committed
  `package-lock.json`, into `tests/interop/js_peer/node_modules` (git-ignored).
- Installs again only when `package-lock.json` changed since the last successful install
  (a stamp in `node_modules` holds its sha256) or the install is incomplete.
- `ensure_installed()` never raises for a missing Node/npm, a Node too old or a failed
  `npm ci`: it returns the reason, which the test skips with.

Run as `python -m tests.interop.js_peer_setup`: prints what it did; exits 0 either way
(the test says why it skipped), so `make test` runs everything else.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

JS_PEER_DIR = Path(__file__).resolve().with_name("js_peer")
STAMP = JS_PEER_DIR / "node_modules" / ".swarm-installed"
MIN_NODE_MAJOR = 20
NPM_CI_TIMEOUT_S = 300


def _lock_digest() -> str:
    return hashlib.sha256((JS_PEER_DIR / "package-lock.json").read_bytes()).hexdigest()


def node_problem() -> str | None:
    """Why Node.js cannot run the peer here, or None."""
    node = shutil.which("node")
    if node is None:
        return "node (Node.js >= 20) is not on PATH"
    try:
        version = subprocess.run(
            [node, "--version"], capture_output=True, text=True, timeout=30, check=True
        ).stdout.strip()
        major = int(version.lstrip("v").split(".")[0])
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        return f"`node --version` failed: {exc}"
    if major < MIN_NODE_MAJOR:
        return f"node {version} is older than v{MIN_NODE_MAJOR} (js-libp2p 2.x needs it)"
    return None


def ensure_installed() -> str | None:
    """Install the peer's packages if needed; None when ready, else why not."""
    problem = node_problem()
    if problem is not None:
        return problem
    if STAMP.exists() and STAMP.read_text().strip() == _lock_digest():
        return None
    npm = shutil.which("npm")
    if npm is None:
        return "npm is not on PATH (needed for `npm ci` in tests/interop/js_peer)"
    command = [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"]
    try:
        done = subprocess.run(
            command, cwd=JS_PEER_DIR, capture_output=True, text=True, timeout=NPM_CI_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return f"`npm ci` in {JS_PEER_DIR} ran past {NPM_CI_TIMEOUT_S} s"
    except OSError as exc:
        return f"`npm ci` in {JS_PEER_DIR} could not start: {exc}"
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip()[-800:]
        return f"`npm ci` in {JS_PEER_DIR} failed (exit {done.returncode}): {tail}"
    STAMP.write_text(_lock_digest() + "\n")
    return None


def main() -> int:
    problem = ensure_installed()
    if problem is None:
        print(f"js peer packages ready in {JS_PEER_DIR / 'node_modules'}")
    else:
        print(f"js peer not installed, its interop test will skip: {problem}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
