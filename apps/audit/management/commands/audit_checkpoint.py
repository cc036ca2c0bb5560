"""``manage.py audit_checkpoint [--out FILE]``: write the chain head (seq, digest, time) as JSON.

Keep the file somewhere this system cannot write (a ticket, an e-mail to the auditor, WORM
storage). ``audit_verify --checkpoint FILE`` later proves the log up to it was not rewritten.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from apps.audit.services import audit_checkpoint


class Command(BaseCommand):
    help = "Export the audit chain head as a checkpoint file (and record that in the chain)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--out", metavar="FILE", help="write here instead of standard output")
        parser.add_argument(
            "--since",
            metavar="FILE",
            help="an earlier checkpoint: include the consistency proof from it to this one",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        since = json.loads(Path(options["since"]).read_text()) if options.get("since") else None
        checkpoint = audit_checkpoint(actor=None, since=since)
        text = json.dumps(checkpoint, indent=2) + "\n"
        if options.get("out"):
            Path(options["out"]).write_text(text)
            self.stderr.write(f"checkpoint at seq {checkpoint['seq']} written to {options['out']}")
        else:
            self.stdout.write(text, ending="")
