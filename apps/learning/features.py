"""Context features of a request, and the arms' features, in Vowpal Wabbit's text format.

Pure Python (no Django). The question's words are stored only as short keyed hashes
(``w<8 hex>``): a decision row must let the router re-learn when its feedback arrives, but
it must not keep the prompt text (retention erases run content; see docs/learning.md).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

# Cheap task detectors: one regex per tag. They only have to separate traffic well enough for
# the bandit to condition on; the hashed words carry the rest.
TASK_PATTERNS: dict[str, re.Pattern[str]] = {
    "arithmetic": re.compile(
        r"\d+\s*[-+*/x\u00d7\u00f7^]\s*\d+|\b(sum|product|plus|minus|times|divided|multiply|calculate|compute)\b",
        re.IGNORECASE,
    ),
    "code": re.compile(
        r"```|\b(def|class|function|python|javascript|sql|regex|compile|bug|stack ?trace)\b|\w+\(\)",
        re.IGNORECASE,
    ),
    "geography": re.compile(
        r"\b(capital|country|countries|continent|river|mountain|ocean|city|population|border|island)\b",
        re.IGNORECASE,
    ),
    "translation": re.compile(
        r"\b(translate|translation|in (french|german|spanish|english))\b", re.IGNORECASE
    ),
    "summary": re.compile(r"\b(summari[sz]e|summary|tl;?dr)\b", re.IGNORECASE),
}

_WORD = re.compile(r"[a-z0-9]+")
MAX_WORDS = 64
_VW_SPECIAL = re.compile(r"[\s|:]")


def task_tags(question: str) -> list[str]:
    """The detected task tags of a request (sorted, possibly empty)."""
    return sorted(tag for tag, rx in TASK_PATTERNS.items() if rx.search(question))


def _word_token(word: str) -> str:
    return "w" + hashlib.blake2s(word.encode(), digest_size=4, person=b"cw-learn").hexdigest()


def length_bucket(question: str) -> str:
    n = len(question)
    for limit, name in ((40, "xs"), (160, "s"), (640, "m"), (2560, "l")):
        if n <= limit:
            return name
    return "xl"


@dataclass(frozen=True)
class Context:
    """What the router knows of one request: hashed words, tags, length bucket, team."""

    words: tuple[str, ...]
    tags: tuple[str, ...]
    length: str
    team: str = ""
    extra: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, object]:
        return {"words": list(self.words), "tags": list(self.tags), "length": self.length, "team": self.team}

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Context:
        def seq(key: str) -> tuple[str, ...]:
            value = data.get(key) or []
            return tuple(str(v) for v in value) if isinstance(value, list) else ()

        return cls(seq("words"), seq("tags"), str(data.get("length") or "s"), str(data.get("team") or ""))

    def fingerprint(self) -> str:
        raw = "|".join([",".join(self.words), ",".join(self.tags), self.length, self.team])
        return hashlib.sha256(raw.encode()).hexdigest()[:16]

    def shared_line(self) -> str:
        # Namespaces by first letter: s (words), t (task tags), l (length and team).
        words = " ".join(self.words) or "none"
        tags = " ".join(self.tags) or "untagged"
        team = _clean(self.team) or "none"
        return f"shared |s {words} |t {tags} |l len_{self.length} team_{team}"


def context_of(question: str, *, team: str | int = "") -> Context:
    words = list(dict.fromkeys(_WORD.findall(question.lower())))[:MAX_WORDS]
    return Context(
        words=tuple(_word_token(w) for w in words),
        tags=tuple(task_tags(question)),
        length=length_bucket(question),
        team=str(team),
    )


def _clean(value: str) -> str:
    return _VW_SPECIAL.sub("_", value)


def arm_line(arm_id: str, *, kind: str, worker: str | None, preset: str | None) -> str:
    """One action's features (namespace a): the arm id, its strategy and its worker."""
    parts = [f"arm_{_clean(arm_id)}", f"kind_{_clean(kind)}"]
    if worker:
        parts.append(f"worker_{_clean(worker)}")
    if preset:
        parts.append(f"preset_{_clean(preset)}")
    return "|a " + " ".join(parts)
