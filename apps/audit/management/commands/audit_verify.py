"""``manage.py audit_verify [--checkpoint FILE] [--incremental]``: walk the audit log; exit 0 when intact.

Checks the hash chain, the Merkle leaves, every signed tree head in the database and the last one
published to ``AUDIT_STH_PUBLISH_PATH``.

On damage it exits 1 and prints the first broken sequence number and why (edited, deleted,
reordered, inserted, rewritten). The outcome is stored on the chain head for the UI.
"""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.audit.services import hmac_key
from apps.audit.verify import Checkpoint, default_workers, verify_and_record


class Command(BaseCommand):
    help = "Verify the audit chain (and optionally that it matches an external checkpoint)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--checkpoint", metavar="FILE", help="a JSON file written by audit_checkpoint")
        parser.add_argument(
            "--incremental",
            action="store_true",
            help="only events after the last successful verification (resumes from its Merkle frontier)",
        )
        parser.add_argument(
            "--workers", type=int, default=0, help="verify processes (default: one per CPU, at most 8)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        checkpoint = None
        if options.get("checkpoint"):
            try:
                checkpoint = Checkpoint.load(options["checkpoint"])
            except (OSError, ValueError) as exc:
                raise CommandError(f"cannot read checkpoint: {exc}") from exc
        started = time.monotonic()
        result = verify_and_record(
            key=hmac_key(),
            checkpoint=checkpoint,
            incremental=bool(options.get("incremental")),
            workers=options.get("workers") or default_workers(),
        )
        elapsed = time.monotonic() - started
        if result.ok:
            suffix = f"; matches checkpoint at seq {checkpoint.seq}" if checkpoint else ""
            self.stdout.write(f"OK {result.summary()}{suffix} ({elapsed:.2f}s)")
            return
        self.stderr.write(f"BROKEN seq={result.broken_seq} reason={result.reason}: {result.message}")
        raise SystemExit(1)
