"""Prompt-injection and jailbreak heuristics, for requests and for worker outputs that later
steps read (an injected web page or document must not steer the next worker).

Heuristics, not a classifier: they catch the common phrasings (in English, French, German,
Spanish and Italian) cheaply and deterministically, on the canonical form of the text
(``normalize``: a zero-width space inside "ignore" does not hide it). A paraphrase, or another
language, is a judgement call no pattern makes: a model-judged check can back them up (see
docs/security.md). Policies add their own patterns (`extra_patterns`).
Each built-in rule has lower-case "needles": its regex only runs when one occurs in the text,
which keeps a 100 KB clean text cheap."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from apps.policies.guardrails import regex as safe_regex
from apps.policies.guardrails.base import Finding

_RULES: list[tuple[str, str, tuple[str, ...]]] = [
    (
        r"\b(?:ignore|disregard|forget|override|bypass)\b[^.\n]{0,40}?\b(?:previous|prior|above|earlier|all|any|your|the|system)\b"
        r"[^.\n]{0,30}?\b(?:instructions?|prompts?|rules|directions|guidelines|messages?|constraints)\b",
        "instruction override",
        ("ignore", "disregard", "forget", "override", "bypass"),
    ),
    (
        r"\b(?:reveal|print|show|repeat|output|leak)\b[^.\n]{0,30}?\b(?:system|hidden|initial|developer)\s+(?:prompt|instructions?|message)\b",
        "system prompt extraction",
        ("prompt", "instruction", "message"),
    ),
    (
        r"\byou\s+are\s+now\b[^.\n]{0,40}?\b(?:DAN|unfiltered|uncensored|jailbroken|unrestricted|evil|developer mode)\b",
        "persona jailbreak",
        ("you are now",),
    ),
    (
        r"\b(?:do\s+anything\s+now|DAN\s+mode|developer\s+mode\s+(?:enabled|on)|jailbreak(?:ed)?\s+mode)\b",
        "known jailbreak phrase",
        ("anything now", "dan mode", "developer mode", "jailbreak"),
    ),
    (
        r"\b(?:pretend|act|behave|roleplay)\b[^.\n]{0,40}?\b(?:no|without|free\s+of)\s+(?:any\s+)?"
        r"(?:restrictions|rules|filters|limits|guidelines|censorship)\b",
        "restriction removal",
        ("restriction", "rules", "filter", "limits", "guideline", "censor"),
    ),
    (
        r"(?:^|\n)\s*(?:#{1,3}\s*)?(?:system|assistant)\s*:\s*(?:new\s+)?(?:instructions?|rules|prompt)\b",
        "fake role header",
        ("system", "assistant"),
    ),
    (
        r"</?\s*(?:system|im_start|im_end|\|im_start\|)\s*>|\[/?INST\]|<<SYS>>",
        "chat template tokens",
        ("<", "[inst]", "[/inst]"),
    ),
    (r"\bnew\s+instructions?\s*:", "injected instructions", ("instruction",)),
    # The same attacks in French, German, Spanish and Italian. The detectors read the canonical
    # form (normalize): accents are gone there, so "précédentes" is matched as "precedentes".
    (
        r"\b(?:ignore[rsz]|ignore\s+(?:les|tes|vos|toutes|ces|mes)|oublie[rsz]?|ne\s+tien[st]?\s+pas\s+compte|ne\s+tenez\s+pas\s+compte)\b"
        r"[^.\n]{0,40}?\b(?:instructions?|consignes?|regles|directives|prompts?)\b",
        "instruction override (fr)",
        ("ignor", "oubli", "pas compte"),
    ),
    (
        r"\b(?:ignorier(?:e|en|t)?|vergiss|vergessen|missachte[nt]?|uberschreibe|verwirf)\b"
        r"[^.\n]{0,40}?\b(?:anweisungen|anweisung|instruktionen|regeln|vorgaben|befehle|richtlinien)\b",
        "instruction override (de)",
        ("ignorier", "vergiss", "vergessen", "missacht", "uberschreib", "verwirf"),
    ),
    (
        r"\b(?:ignora|ignore|ignorad|olvida|olvide|omite|dimentica|ignorate)\b"
        r"[^.\n]{0,40}?\b(?:instrucciones|instruccion|reglas|indicaciones|istruzioni|regole)\b",
        "instruction override (es/it)",
        ("ignora", "ignore", "olvid", "omite", "dimentic"),
    ),
    (
        r"\b(?:revele[rz]?|affiche[rz]?|montre[rz]?|donne[rz]?|repete[rz]?)\b[^.\n]{0,30}?"
        r"\b(?:prompt|instructions?|consignes?|message)\s+(?:systeme|initia(?:l|les?|ux)|cache(?:s|es)?)\b",
        "system prompt extraction (fr)",
        ("revel", "affich", "montre", "donne", "repete"),
    ),
    (
        r"\b(?:zeige?|gib|verrate|wiederhole|nenne)\b[^.\n]{0,30}?"
        r"\b(?:system-?prompt|systemanweisung(?:en)?|systemnachricht|versteckten?\s+anweisungen)\b",
        "system prompt extraction (de)",
        ("systemprompt", "system-prompt", "systemanweisung", "systemnachricht", "versteckte"),
    ),
]

# A compiled `re` pattern (built-in rules) or an RE2 one (the policy's own patterns).
Rule = tuple[Any, str, tuple[str, ...]]


def compile_rules(extra_patterns: Iterable[str] = ()) -> list[Rule]:
    rules: list[Rule] = [(re.compile(p, re.I), label, needles) for p, label, needles in _RULES]
    # The policy's own patterns go through RE2: a backtracking `(a+)+$` must not freeze a worker.
    rules.extend((safe_regex.compile_pattern(p), "policy pattern", ()) for p in extra_patterns)
    return rules


_DEFAULT = compile_rules()


def scan(text: str, extra_patterns: Iterable[str] = ()) -> list[Finding]:
    extra = tuple(extra_patterns)
    rules = _DEFAULT if not extra else compile_rules(extra)
    if extra:
        safe_regex.check_input_size(text)
    low = text.lower()
    out: list[Finding] = []
    for pattern, label, needles in rules:
        if needles and not any(n in low for n in needles):
            continue
        for m in pattern.finditer(text):
            out.append(
                Finding(
                    "injection",
                    m.start(),
                    m.end(),
                    f"possible prompt injection ({label})",
                    "[REMOVED:injection]",
                )
            )
    return out
