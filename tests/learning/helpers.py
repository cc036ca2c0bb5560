"""Two fake workers on one real loopback OpenAI-compatible server: ``arith-1`` answers arithmetic
right and geography wrong, ``geo-1`` the reverse; ``banned-1`` is in the pool but denied by the
test policies. A labelled question set with a grader."""

from __future__ import annotations

import random
import re
from typing import Any

from tests.factories.workers import build_openai_compatible_pool
from tests.fakes.openai_server import FakeOpenAIServer

CAPITALS = {
    "France": "Paris",
    "Germany": "Berlin",
    "Italy": "Rome",
    "Spain": "Madrid",
    "Japan": "Tokyo",
    "Kenya": "Nairobi",
    "Peru": "Lima",
    "Egypt": "Cairo",
    "Canada": "Ottawa",
    "Norway": "Oslo",
}
_SUM = re.compile(r"(\d+)\s*\+\s*(\d+)")
_CAPITAL = re.compile(r"capital of (\w+)")


def _last_user(req: dict[str, Any]) -> str:
    # The executor frames the question with the step's instruction: read every message.
    return "\n".join(str(m.get("content", "")) for m in req.get("messages") or [])


class ArithGeoServer(FakeOpenAIServer):
    """The fake OpenAI server whose models know only one task each."""

    def __init__(self) -> None:
        super().__init__(responder=self.answer)

    @staticmethod
    def answer(req: dict[str, Any]) -> str:
        text = _last_user(req)
        model = req.get("model")
        m, c = _SUM.search(text), _CAPITAL.search(text)
        if model == "arith-1":
            return str(int(m.group(1)) + int(m.group(2))) if m else "Springfield"
        if model == "geo-1":
            return CAPITALS.get(c.group(1), "Atlantis") if c else "7"
        return "I am not sure."


def build_pool(team: Any, server: ArithGeoServer, *, prices: dict[str, tuple[str, str]] | None = None) -> Any:
    prices = prices or {}

    def spec(slug: str, model: str, tags: list[str]) -> dict[str, Any]:
        inp, out = prices.get(slug, ("1", "2"))
        return {
            "slug": slug,
            "display_name": slug,
            "model_name": model,
            "tags": tags,
            "input_price_per_mtok": inp,
            "output_price_per_mtok": out,
            "max_output_tokens": 64,
        }

    pool, _provider, _workers, _conductor = build_openai_compatible_pool(
        team=team,
        base_url=server.base_url,
        api_key="sk-learn-test",
        slug="learn",
        provider_slug="learn-openai",
        workers=[
            spec("arith", "arith-1", ["external"]),
            spec("geo", "geo-1", ["external"]),
            spec("banned", "banned-1", ["external"]),
        ],
        conductor={**spec("learn-conductor", "conductor-1", ["external"])},
    )
    return pool


def labelled_set(seed: int, n: int) -> list[tuple[str, str, str]]:
    """[(task, question, expected)] alternating-ish arithmetic and geography, deterministic."""
    rng = random.Random(seed)
    out: list[tuple[str, str, str]] = []
    countries = list(CAPITALS)
    for _ in range(n):
        if rng.random() < 0.5:
            a, b = rng.randint(1, 500), rng.randint(1, 500)
            phrasing = rng.choice(["What is {a} + {b}?", "Compute {a} + {b}.", "Add: {a} + {b} = ?"])
            out.append(("arithmetic", phrasing.format(a=a, b=b), str(a + b)))
        else:
            country = rng.choice(countries)
            phrasing = rng.choice(
                [
                    "What is the capital of {c}?",
                    "Name the capital of {c}.",
                    "Which city is the capital of {c}?",
                ]
            )
            out.append(("geography", phrasing.format(c=country), CAPITALS[country]))
    return out
