"""``manage.py audit_keys``: print the audit log's verifier keys (c2sp.org/signed-note vkeys).

Hand them to auditors out of band: ``scripts/verify_audit_export.py --vkey-file`` needs nothing
else. The first key signs new checkpoints; the others are retired keys (rotation) whose
checkpoints still verify. ``--witnesses`` adds the configured witnesses' cosigner keys;
``--origin`` prints the log's origin; ``--generate`` prints a new private key for
``AUDIT_SIGNING_KEY`` (to rotate: set it, and move the current key's public half, printed with
``--public``, to ``AUDIT_SIGNING_KEYS_RETIRED``).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from apps.audit import notes
from apps.audit.checkpoints import log_origin
from apps.audit.logkeys import decode_seed, generate_seed, log_signer, log_verifiers, witnesses


class Command(BaseCommand):
    help = "Print the audit log's verifier keys (vkeys), or generate a signing key."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--witnesses", action="store_true", help="also the witnesses' cosigner keys")
        parser.add_argument("--origin", action="store_true", help="print the log's origin only")
        parser.add_argument(
            "--public", action="store_true", help="print the signing key's public half (base64)"
        )
        parser.add_argument(
            "--generate", action="store_true", help="print a new private key for AUDIT_SIGNING_KEY"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["generate"]:
            seed = generate_seed()
            public = notes.Signer("x", decode_seed(seed, "generated")).public
            self.stdout.write(f"AUDIT_SIGNING_KEY={seed}")
            self.stderr.write(f"its public key (for AUDIT_SIGNING_KEYS_RETIRED later): {notes.b64(public)}")
            return
        origin = log_origin()
        if options["origin"]:
            self.stdout.write(origin)
            return
        if options["public"]:
            self.stdout.write(notes.b64(log_signer(origin).public))
            return
        for key in log_verifiers(origin):
            self.stdout.write(key.vkey)
        if options["witnesses"]:
            for witness in witnesses():
                self.stdout.write(witness.key.vkey)
