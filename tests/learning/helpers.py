"""Two fake workers on one real loopback OpenAI-compatible server: ``arith-1`` answers arithmetic
right and geography wrong, ``geo-1`` the reverse; ``banned-1`` is in the pool but denied by the
test policies. A labelled question set with a grader."""

from __future__ import annotations

import random
import re
from functools import partial
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


# --- the convergence setup without the database (many exploration seeds, seconds each) -----------

SIM_RIGHT = {"arithmetic": "single:arith", "geography": "single:geo"}


def simulate_router(seed: int, events: int = 300, share: float = 0.05) -> tuple[dict[str, float], int]:
    """The router of ``apps.learning.services.route`` over ``labelled_set(seed, events)``: the same
    bandit (saved and reloaded per request), the same exploration (``exploration_rate`` with try
    counts per task tags, rng seeded by the run id), rewards as in the acceptance test (a single
    worker right on its task, a composite arm a coin flip). Returns (share of each task type sent
    to its worker over the last 100 requests, number of explored requests)."""
    import uuid
    from decimal import Decimal

    from apps.learning.bandit import Arm, Bandit, choose, exploration_rate
    from apps.learning.features import context_of

    arms = [
        Arm("single:arith", "single", worker="arith", forecast_cost_usd=Decimal("0.0002")),
        Arm("single:geo", "single", worker="geo", forecast_cost_usd=Decimal("0.0002")),
        Arm("moa", "moa", forecast_cost_usd=Decimal("0.0005")),
        Arm("pev", "pev", forecast_cost_usd=Decimal("0.0007")),
        Arm("conductor-mini", "conductor", preset="mini", forecast_cost_usd=Decimal("0.001")),
        Arm("conductor-ultra", "conductor", preset="ultra", forecast_cost_usd=Decimal("0.003")),
    ]
    rng = random.Random(seed)
    state: bytes | None = None
    history: list[tuple[str, tuple[str, ...], str, bool]] = []
    for task, question, _expected in labelled_set(seed, events):
        run_id = uuid.UUID(int=rng.getrandbits(128))
        ctx = context_of(question, team=1)
        with Bandit(state) as bandit:
            scores = bandit.scores(ctx, arms)

        def tried(tags: tuple[str, ...] = ctx.tags) -> dict[str, int]:
            counts: dict[str, int] = {}
            for _t, seen, arm_id, _e in history[-500:]:
                if seen == tags:
                    counts[arm_id] = counts.get(arm_id, 0) + 1
            return counts

        eps, counts = exploration_rate(
            share, decisions=len(history), explored=sum(h[3] for h in history), arms=arms, tried=tried
        )
        choice = choose(
            scores,
            arms,
            epsilon=eps,
            rng=random.Random(str(run_id)),
            tried=partial(dict, counts) if counts is not None else None,
        )
        arm = arms[choice.index]
        if arm.kind == "single":
            value = 1.0 if SIM_RIGHT[task] == arm.id else 0.0
        else:
            value = 1.0 if rng.random() < 0.5 else 0.0
        with Bandit(state) as bandit:
            bandit.learn(ctx, arms, choice.index, value, choice.probs[choice.index])
            state = bandit.to_bytes()
        history.append((task, ctx.tags, arm.id, choice.explored))
    tail = history[-100:]
    shares = {
        task: sum(h[2] == right for h in tail if h[0] == task) / max(1, sum(h[0] == task for h in tail))
        for task, right in SIM_RIGHT.items()
    }
    return shares, sum(h[3] for h in history)
