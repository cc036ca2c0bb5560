"""Ask witnesses to cosign our checkpoints (c2sp.org/tlog-witness ``add-checkpoint``) and keep
their cosignatures.

The request is ``old <size>``, the consistency proof from that size (base64, one a line), a blank
line and the checkpoint. A witness answers 409 with the size it last cosigned when ours is
stale (we resend from there), 4xx when the checkpoint is not an extension of what it saw (a
fork: nothing is cosigned; logged as an error), or 200 with its cosignature lines, which we
verify against its key before storing them.
"""

from __future__ import annotations

import logging
import urllib.error
import urllib.request

from django.conf import settings

from apps.audit import notes
from apps.audit.logkeys import Witness, witnesses
from apps.audit.models import Cosignature, SignedTreeHead
from apps.audit.proofs import consistency_proof

logger = logging.getLogger(__name__)
CONTENT_TYPE = "text/plain; charset=utf-8"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None  # a witness answers itself; a redirect is refused, not followed


_OPENER = urllib.request.build_opener(_NoRedirect)


def request_body(old_size: int, proof: list[bytes], note: str) -> bytes:
    return (f"old {old_size}\n" + "".join(f"{notes.b64(h)}\n" for h in proof) + "\n" + note).encode()


def _post(url: str, body: bytes) -> tuple[int, str]:
    # http(s) only: logkeys.witnesses() refuses any other scheme in AUDIT_WITNESSES.
    request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": CONTENT_TYPE})  # noqa: S310
    timeout = float(getattr(settings, "AUDIT_WITNESS_TIMEOUT_S", 5.0))
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            return response.status, response.read(1 << 16).decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(1 << 16).decode("utf-8", "replace")


def last_cosigned_size(witness: Witness, origin: str) -> int:
    return (
        Cosignature.objects.filter(
            checkpoint__origin=origin, witness=witness.name, key_id=f"{witness.key.key_id:08x}"
        )
        .order_by("-checkpoint__tree_size")
        .values_list("checkpoint__tree_size", flat=True)
        .first()
        or 0
    )


def submit(witness: Witness, sth: SignedTreeHead) -> Cosignature | None:
    """One witness, one checkpoint: its cosignature, or None (refused or unreachable; logged)."""
    old = last_cosigned_size(witness, sth.origin)
    for _attempt in range(2):
        if old > sth.tree_size:
            logger.error(
                "witness %s has cosigned size %s of %s, beyond this checkpoint's %s: the log lost its tail",
                witness.name, old, sth.origin, sth.tree_size,
            )  # fmt: skip
            return None
        body = request_body(old, consistency_proof(old, sth.tree_size), sth.note)
        status, text = _post(witness.url + "add-checkpoint", body)
        if status == 409 and text.strip().isdigit():
            old = int(text.strip())  # our record of its state was stale: resend from its size
            continue
        if status != 200:
            logger.error(
                "witness %s refused checkpoint %s size %s (HTTP %s): %s",
                witness.name, sth.origin, sth.tree_size, status, text.strip()[:300],
            )  # fmt: skip
            return None
        return _store(witness, sth, text)
    return None


def _store(witness: Witness, sth: SignedTreeHead, text: str) -> Cosignature | None:
    mine = None
    for line in text.splitlines(keepends=True):
        try:
            opened = notes.open_note(sth.note + line, [witness.key])
        except notes.NoteError:
            continue  # another key's line, or not ours to trust
        (key, when), *_ = opened.verified
        mine, _ = Cosignature.objects.get_or_create(
            checkpoint=sth,
            witness=key.name,
            key_id=f"{key.key_id:08x}",
            defaults={"timestamp": when, "line": line if line.endswith("\n") else line + "\n"},
        )
    if mine is None:
        logger.error("witness %s answered without a valid cosignature of its key", witness.name)
    return mine


def collect_cosignatures(sth: SignedTreeHead) -> list[Cosignature]:
    """Every configured witness that has not cosigned ``sth`` yet is asked; failures are logged
    (a witness being down must not stop the log)."""
    done = set(Cosignature.objects.filter(checkpoint=sth).values_list("witness", "key_id"))
    out = []
    for witness in witnesses():
        if (witness.name, f"{witness.key.key_id:08x}") in done:
            continue
        try:
            cosignature = submit(witness, sth)
        except (OSError, ValueError) as exc:
            logger.warning("witness %s unreachable: %s", witness.name, exc)
            continue
        if cosignature is not None:
            out.append(cosignature)
    return out
