"""The canonical form the detectors read, with a map back to the original text (issue 39).

Ordinary Unicode defeats ASCII patterns: a card grouped with a no-break space (U+00A0) or the
French narrow no-break space (U+202F), digits joined by zero-width joiners, full-width digits or
a full-width at sign (U+FF20), a Cyrillic dze (U+0455, drawn like s) inside ``sk-proj-…``. The detectors therefore scan a
*canonical* form of the text, character by character:

- format characters (Unicode category Cf: zero-width space/joiners, word joiner, soft hyphen,
  bidi controls, BOM) and combining marks (Mn/Me: accents, variation selectors) are removed;
- every space separator (Zs: NBSP, U+202F, thin and ideographic spaces) becomes ``" "``, line and
  paragraph separators ``"\\n"``, other controls ``" "``;
- decimal digits of every script become ASCII digits (``unicodedata.decimal``);
- dashes (Pd, U+2212 minus) become ``-``; middle dots and bullets ``.``;
- the rest is NFKD-decomposed (full-width and other compatibility forms: U+FF14 → ``4``,
  U+FF20 → ``@``, the ligature U+FB01 → ``fi``) and every non-ASCII letter that the Unicode
  confusables table (UTS #39, through ``confusable_homoglyphs``) lists as a look-alike of an
  ASCII letter or digit becomes that letter (Cyrillic U+0455 → ``s``, Greek U+03BF → ``o``).

Case is kept (secret patterns are case-sensitive). Each canonical character comes from exactly
one original character, so ``Canonical.span`` maps a finding back to the original span and
redaction masks the *original* text: what reaches a provider is the user's text with the finding
replaced, never the canonical form.

Streaming: the mapping has no look-ahead (each character is mapped on its own), so the canonical
form of a prefix is a prefix of the canonical form of the whole. ``Canonical.extend`` appends a
chunk; an output gate can feed a stream piece by piece (issue 45) with this same implementation.
Pure Python, no Django.
"""

from __future__ import annotations

import re
import threading
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import replace

from apps.policies.guardrails.base import Finding

_DASHES = frozenset("\u2010\u2011\u2012\u2013\u2014\u2015\u2043\u2212\ufe58\ufe63\uff0d")
_DOTS = frozenset("\u00b7\u2022\u2024\u2027\u2219\u22c5\u30fb\uff0e\uff65")
_NON_ASCII = re.compile(r"[^\x00-\x7f]")

_confusable_map: dict[str, str] | None = None
_confusable_lock = threading.Lock()


def _ascii_rank(candidate: str, original: str) -> tuple[int, str]:
    """Prefer a look-alike of the same case, then any letter, then a digit, then the rest."""
    if candidate.isalpha():
        same_case = candidate.isupper() == original.isupper() or not original.isalpha()
        return (0 if same_case else 1, candidate)
    if candidate.isdigit():
        return (2, candidate)
    return (3, candidate)


def confusable_map() -> dict[str, str]:
    """Non-ASCII character → the ASCII letter or digit it is confusable with (UTS #39 data,
    loaded once on first use: a text that is all ASCII never pays for it)."""
    global _confusable_map
    if _confusable_map is not None:
        return _confusable_map
    with _confusable_lock:
        if _confusable_map is None:
            from confusable_homoglyphs.confusables import confusables_data  # ~0.9 MB of JSON

            built: dict[str, str] = {}
            for char, glyphs in confusables_data.items():
                if len(char) != 1 or char.isascii():
                    continue
                ascii_alnum = [
                    g["c"] for g in glyphs if len(g["c"]) == 1 and g["c"].isascii() and g["c"].isalnum()
                ]
                if ascii_alnum:
                    built[char] = min(ascii_alnum, key=lambda c, o=char: _ascii_rank(c, o))  # type: ignore[misc]
            _confusable_map = built
    return _confusable_map


_char_cache: dict[str, str] = {}


def canonical_char(ch: str) -> str:
    """The canonical form of one non-ASCII character ("" when it is removed)."""
    hit = _char_cache.get(ch)
    if hit is not None:
        return hit
    out = _map_char(ch)
    if len(_char_cache) < 65_536:
        _char_cache[ch] = out
    return out


def _map_char(ch: str) -> str:
    category = unicodedata.category(ch)
    if category in ("Cf", "Mn", "Me"):
        return ""
    if category == "Zs":
        return " "
    if category in ("Zl", "Zp"):
        return "\n"
    if category == "Cc":  # C1 controls
        return " "
    digit = unicodedata.decimal(ch, None)
    if digit is not None:
        return str(digit)
    if ch in _DASHES or category == "Pd":
        return "-"
    if ch in _DOTS:
        return "."
    confusables = confusable_map()
    parts: list[str] = []
    for c in unicodedata.normalize("NFKD", ch):
        if c.isascii():
            parts.append(c)
            continue
        sub = unicodedata.category(c)
        if sub in ("Cf", "Mn", "Me"):
            continue
        if sub == "Zs":
            parts.append(" ")
            continue
        digit = unicodedata.decimal(c, None)
        if digit is not None:
            parts.append(str(digit))
        elif c in _DASHES or sub == "Pd":
            parts.append("-")
        else:
            parts.append(confusables.get(c, c))
    return "".join(parts)


class Canonical:
    """A text's canonical form and, for each canonical character, the index of the original
    character it came from (``None`` while the two are identical: all-ASCII text)."""

    __slots__ = ("_origin", "_original_len", "text")

    def __init__(self) -> None:
        self.text = ""
        self._origin: list[int] | None = None
        self._original_len = 0

    @property
    def identical(self) -> bool:
        return self._origin is None

    def extend(self, more: str) -> str:
        """Append ``more`` (the next piece of the original text); returns its canonical piece."""
        base = self._original_len
        self._original_len += len(more)
        if self._origin is None and not _NON_ASCII.search(more):
            self.text += more
            return more
        if self._origin is None:
            self._origin = list(range(len(self.text)))
        origin = self._origin
        pieces: list[str] = []
        pos = 0
        for match in _NON_ASCII.finditer(more):
            i = match.start()
            if i > pos:  # an ASCII run maps to itself
                pieces.append(more[pos:i])
                origin.extend(range(base + pos, base + i))
            mapped = canonical_char(more[i])
            if mapped:
                pieces.append(mapped)
                origin.extend([base + i] * len(mapped))
            pos = i + 1
        if pos < len(more):
            pieces.append(more[pos:])
            origin.extend(range(base + pos, base + len(more)))
        piece = "".join(pieces)
        self.text += piece
        return piece

    def span(self, start: int, end: int) -> tuple[int, int]:
        """The original span that canonical ``[start, end)`` came from (whole characters: a
        finding that ends inside an expanded character masks all of it)."""
        if self._origin is None:
            return start, end
        if start >= len(self._origin):
            return self._original_len, self._original_len
        o_start = self._origin[start]
        o_end = self._origin[end - 1] + 1 if end > start else o_start
        return o_start, o_end


def canonical(text: str) -> Canonical:
    canon = Canonical()
    canon.extend(text)
    return canon


def canonical_text(text: str) -> str:
    return canonical(text).text


Scanner = Callable[[str], Iterable[Finding]]

# The detectors of one stage (or of the outbound gate) read the same text one after the other:
# its canonical form is made once. A few entries, by value; never extended.
_RECENT = 8
_recent_forms: dict[str, Canonical] = {}
_recent_lock = threading.Lock()


def _recent(text: str) -> Canonical:
    with _recent_lock:
        hit = _recent_forms.get(text)
    if hit is not None:
        return hit
    canon = canonical(text)
    if not canon.identical:
        with _recent_lock:
            if len(_recent_forms) >= _RECENT:
                _recent_forms.pop(next(iter(_recent_forms)))
            _recent_forms[text] = canon
    return canon


def detect(text: str, scan: Scanner, *, also_original: bool = False) -> list[Finding]:
    """``scan``'s findings on the canonical form of ``text``, with spans in ``text``.

    ``also_original``: scan the original too and keep both (for the policy's own regular
    expressions, which may be written for accented or non-Latin text the canonical form folds)."""
    canon = _recent(text)
    if canon.identical:
        return list(scan(text))
    found = [_moved(f, canon) for f in scan(canon.text)]
    if also_original:
        seen = {(f.kind, f.start, f.end) for f in found}
        found.extend(f for f in scan(text) if (f.kind, f.start, f.end) not in seen)
    return found


def _moved(finding: Finding, canon: Canonical) -> Finding:
    start, end = canon.span(finding.start, finding.end)
    return replace(finding, start=start, end=end)


__all__ = ["Canonical", "canonical", "canonical_char", "canonical_text", "confusable_map", "detect"]
