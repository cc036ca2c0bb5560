"""Run ``scripts/verify_audit_export.py`` as an outside auditor would: a subprocess in isolated
mode (``-I``: it cannot lean on this project's modules) with the log's public key only."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "verify_audit_export.py"


def log_vkeys() -> list[str]:
    # Imported here, not above: the reproductions that use this module also run against the code
    # from before issue 40 (which has no such module) and must fail on their assertions there.
    from apps.audit.checkpoints import log_origin
    from apps.audit.logkeys import log_verifiers

    return [key.vkey for key in log_verifiers(log_origin())]


def verify_offline(
    *args: str | Path, vkeys: list[str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``args``: files and options after the keys; ``vkeys``: default the log's own."""
    keys = [arg for vkey in (log_vkeys() if vkeys is None else vkeys) for arg in ("--vkey", vkey)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AUDIT_", "DJANGO_", "DATABASE_"))}
    return subprocess.run(
        [sys.executable, "-I", str(SCRIPT), *keys, *map(str, args)],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def script_module() -> ModuleType:
    """The verifier imported as a module, for its functions (known-answer tests)."""
    spec = importlib.util.spec_from_file_location("verify_audit_export", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
