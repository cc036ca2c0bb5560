"""The detectors' canonical form (issue 39): what it folds, the map back to the original, and the
property a streaming output gate needs (a prefix's canonical form is a prefix of the whole's)."""

from __future__ import annotations

import random

from apps.policies.guardrails import pii, secrets
from apps.policies.guardrails.base import apply_redactions
from apps.policies.guardrails.normalize import Canonical, canonical, canonical_text, detect

SAMPLES = [
    "plain ascii stays as it is",
    "card 4111\u00a01111\u202f1111\u20091111 ok",
    "\uff14\uff11\uff11\uff11 \u0664\u0661\u0661\u0661 \u096a\u0967",
    "a\u200bb\u200cc\u200dd\u2060e\ufeff\u00adf",
    "\u0455k-proj \u03bfk caf\u00e9 \ufb01ne \u2014 \u00b7",
    "mixed \U0001d7d2\U0001d7cf and emoji \U0001f600 stay",
]


def test_what_the_canonical_form_folds() -> None:
    assert canonical_text("4111\u00a01111\u202f1111") == "4111 1111 1111"
    assert canonical_text("a\u200bb\u200dc\u2060d\ufeffe\u00adf") == "abcdef"
    assert canonical_text("\uff14\uff11\u0664\u096a\U0001d7d2") == "41444"
    assert canonical_text("bob\uff20example\uff0ecom") == "bob@example.com"
    assert canonical_text("\u0455k-proj") == "sk-proj"  # Cyrillic dze, a confusable of s
    assert canonical_text("pr\u00e9c\u00e9dentes") == "precedentes"
    assert canonical_text("x\u2014y\u2212z\u2011w") == "x-y-z-w"
    assert canonical_text("\U0001f600") == "\U0001f600"  # not a look-alike of anything: kept


def test_an_ascii_text_is_its_own_canonical_form() -> None:
    canon = canonical("nothing to fold here")
    assert canon.identical and canon.span(3, 7) == (3, 7)


def test_spans_map_back_to_the_original_characters() -> None:
    text = "pay 4\u200b1\u200b1\u200b1\u00a01111\u00a01111\u00a01111 now"
    [found] = detect(text, lambda t: pii.scan(t, ["card"]))
    assert text[found.start : found.end] == "4\u200b1\u200b1\u200b1\u00a01111\u00a01111\u00a01111"
    assert apply_redactions(text, [found]) == "pay [REDACTED:card] now"
    key = "\u0455k-proj-" + "Ab3dE5fG7h" * 3
    [secret] = detect(f"key {key}!", lambda t: secrets.scan(t, ["openai"]))
    assert (secret.start, secret.end) == (4, 4 + len(key))


def test_a_prefix_is_canonicalised_as_the_whole_is() -> None:
    """Fed piece by piece (a stream), the canonical form and the map are those of the whole text."""
    rng = random.Random(39)
    for text in SAMPLES:
        whole = canonical(text)
        for _ in range(20):
            cuts = sorted(rng.sample(range(len(text) + 1), k=min(3, len(text) + 1)))
            streamed = Canonical()
            pieces = []
            last = 0
            for cut in [*cuts, len(text)]:
                pieces.append(streamed.extend(text[last:cut]))
                last = cut
            assert streamed.text == whole.text == "".join(pieces)
            for i in range(len(whole.text)):
                assert streamed.span(i, i + 1) == whole.span(i, i + 1)
