"""Convergence of the learned router: cumulative regret vs feedback count (issue 19).

The setup of tests/learning/test_convergence.py without the database: two workers, ``arith``
(right on arithmetic, wrong on geography) and ``geo`` (the reverse), plus MoA, PEV and the two
conductor presets (their two workers disagree: right half of the time). The router is the same
`apps.learning.bandit.Bandit` (Vowpal Wabbit cb_adf + the policy-bounded epsilon layer), saved
and reloaded between requests as the service does. Regret per request = best expected reward
(1.0) - the chosen arm's expected reward; averaged over seeds.

    .venv/bin/python bench/learning_bench.py --events 300 --seeds 5 --epsilon 0.05

Writes bench/learning_regret.svg (a hand-written SVG: matplotlib is not installed and plotly's
static export needs kaleido) and prints a table.
"""

from __future__ import annotations

import argparse
import random
import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from apps.learning.bandit import Arm, Bandit, choose, exploration_rate
from apps.learning.features import context_of

ARMS = [
    Arm("single:arith", "single", worker="arith"),
    Arm("single:geo", "single", worker="geo"),
    Arm("moa", "moa"),
    Arm("pev", "pev"),
    Arm("conductor-mini", "conductor", preset="mini"),
    Arm("conductor-ultra", "conductor", preset="ultra"),
]
RIGHT = {"arithmetic": "single:arith", "geography": "single:geo"}
COUNTRIES = ["France", "Germany", "Italy", "Spain", "Japan", "Kenya", "Peru", "Egypt", "Canada", "Norway"]


def expected_reward(arm: Arm, task: str) -> float:
    if arm.kind == "single":
        return 1.0 if RIGHT[task] == arm.id else 0.0
    return 0.5


def question(rng: random.Random) -> tuple[str, str]:
    if rng.random() < 0.5:
        return "arithmetic", f"What is {rng.randint(1, 500)} + {rng.randint(1, 500)}?"
    return "geography", f"What is the capital of {rng.choice(COUNTRIES)}?"


def run(seed: int, events: int, epsilon: float) -> tuple[list[float], float, dict[str, float]]:
    """(cumulative regret per event, explored share, share of each task type sent to its worker
    over the last 100 events). Exploration as the service does it (``exploration_rate``: the
    policy's share, the least-tried arm for this kind of request, slower once each is known)."""
    rng = random.Random(seed)
    state: bytes | None = None
    regret, total, explored = [], 0.0, 0
    history: list[tuple[str, tuple[str, ...], str]] = []  # (task, tags, chosen arm)
    for n in range(events):
        task, q = question(rng)
        ctx = context_of(q, team=1)

        def tried(tags: tuple[str, ...] = ctx.tags) -> dict[str, int]:
            counts: dict[str, int] = {}
            for _task, seen, arm_id in history[-500:]:
                if seen == tags:
                    counts[arm_id] = counts.get(arm_id, 0) + 1
            return counts

        with Bandit(state, seed=seed) as bandit:
            scores = bandit.scores(ctx, ARMS)
            eps, counts = exploration_rate(epsilon, decisions=n, explored=explored, arms=ARMS, tried=tried)
            c = choose(
                scores,
                ARMS,
                epsilon=eps,
                rng=random.Random(f"{seed}-{n}"),
                tried=partial(dict, counts) if counts is not None else None,
            )
            explored += c.explored
            arm = ARMS[c.index]
            p_right = expected_reward(arm, task)
            reward = 1.0 if rng.random() < p_right else 0.0
            bandit.learn(ctx, ARMS, c.index, reward, c.probs[c.index])
            state = bandit.to_bytes()
        history.append((task, ctx.tags, arm.id))
        total += 1.0 - p_right
        regret.append(total)
    tail = history[-100:]
    shares = {
        task: sum(a == right for t, _tags, a in tail if t == task)
        / max(1, sum(t == task for t, _, _ in tail))
        for task, right in RIGHT.items()
    }
    return regret, explored / events, shares


def svg(curve: list[float], path: Path, title: str) -> None:
    w, h, pad = 640, 360, 50
    top = max(curve) or 1.0
    pts = " ".join(
        f"{pad + (w - 2 * pad) * i / (len(curve) - 1):.1f},{h - pad - (h - 2 * pad) * v / top:.1f}"
        for i, v in enumerate(curve)
    )
    ticks = "".join(
        f'<text x="{pad + (w - 2 * pad) * f:.0f}" y="{h - pad + 18}" font-size="11" text-anchor="middle">'
        f"{round(f * len(curve))}</text>"
        for f in (0, 0.25, 0.5, 0.75, 1)
    )
    yticks = "".join(
        f'<text x="{pad - 6}" y="{h - pad - (h - 2 * pad) * f + 4:.0f}" font-size="11" text-anchor="end">'
        f"{top * f:.1f}</text>"
        for f in (0, 0.5, 1)
    )
    path.write_text(
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}">'
        f'<rect width="{w}" height="{h}" fill="white"/>'
        f'<text x="{w / 2}" y="24" font-size="14" text-anchor="middle">{title}</text>'
        f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="black"/>'
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="black"/>'
        f'<polyline points="{pts}" fill="none" stroke="#1f6feb" stroke-width="2"/>{ticks}{yticks}'
        f'<text x="{w / 2}" y="{h - 10}" font-size="12" text-anchor="middle">feedback events</text>'
        f'<text x="14" y="{h / 2}" font-size="12" transform="rotate(-90 14 {h / 2})" text-anchor="middle">'
        f"cumulative regret</text></svg>\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=300)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--epsilon", type=float, default=0.05)
    ap.add_argument("--out", default=str(Path(__file__).with_name("learning_regret.svg")))
    args = ap.parse_args()
    curves, shares, converged = [], [], []
    for seed in range(args.seeds):
        curve, share, tail = run(seed, args.events, args.epsilon)
        curves.append(curve)
        shares.append(share)
        converged.append(all(v >= 0.9 for v in tail.values()))
        print(
            f"seed {seed}: regret {curve[-1]:.1f}, explored {share:.3f}, last 100 to the right worker "
            + ", ".join(f"{t} {v:.0%}" for t, v in tail.items()),
            flush=True,
        )
    mean = [sum(c[i] for c in curves) / len(curves) for i in range(args.events)]
    svg(mean, Path(args.out), f"Learned router: cumulative regret ({args.seeds} seeds, eps={args.epsilon})")
    print("| feedback events | cumulative regret (mean) | regret in the last 50 |")
    print("|---:|---:|---:|")
    for n in (25, 50, 100, 150, 200, 250, 300):
        if n <= args.events:
            window = mean[n - 1] - (mean[n - 51] if n > 50 else 0.0)
            print(f"| {n} | {mean[n - 1]:.2f} | {window:.2f} |")
    print(f"explored share per seed: {', '.join(f'{s:.3f}' for s in shares)} (cap {args.epsilon})")
    print(
        f"converged (>= 90 % of each task type to its worker in the last 100): {sum(converged)}/{len(converged)}"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
