"""Executes one Plan on a pool.

Context isolation: a worker sees ONLY the original question, then — for each step in its access
list, in index order — that step's instruction (user turn) and output (assistant turn), then its
own instruction. Nothing else from the run reaches it (`build_messages` is the single place that
assembles worker context).

Scheduling: a step starts as soon as the steps it reads (within this plan; earlier rounds are
already done) have succeeded, with at most `Limits.max_parallel` calls in flight. Each call runs
on its own daemon thread rather than a ThreadPoolExecutor: a call that overruns its timeout
cannot be interrupted, and an abandoned call must neither hold a pool slot nor block
interpreter exit. All events except `step.delta` are emitted from the scheduling thread, so the
per-step event order is deterministic.

Slots (issue 44): a worker with a capacity (the local model: one call at a time, see
``apps.engine.slots``) gives a step its slot before the call. A step that finds every slot taken
is *waiting* (``step.waiting``), not running: its call timeout has not started, only the run's
deadline bounds the wait; when it gets the slot its call starts (``step.running``) and its timeout
with it. A call the executor abandons (its timeout, the run's deadline, cancellation) is cancelled
(``apps.engine.calls``): the local model stops generating and frees the slot for the steps behind
it, an HTTP request is closed.

Failure: a step that fails (provider error after retries, or timeout) is retried once on its
worker's `fallback_key` worker if the pool has it; otherwise it ends `failed`/`timed_out`, the
steps not yet started are `skipped` and the run ends `failed`. A *tolerant* round (issue 44: a
conductor round that ends with the conductor itself, a mixture of agents' proposals) goes on
instead: the failure is a result like any other (the conductor's re-plan sees it), a step whose
inputs are all done runs with those that succeeded (an aggregator with one proposal missing still
aggregates), one whose inputs all failed is skipped, and the round fails only if its answer step
could not run. Blocks, cancellation and the run deadline are never tolerated: they abandon
running calls (their late results are discarded) and skip the rest.
"""

from apps.engine.executor.context import build_messages
from apps.engine.executor.run import PlanExecution, execute_plan, execute_round
from apps.engine.session import CancelToken

__all__ = ["CancelToken", "PlanExecution", "build_messages", "execute_plan", "execute_round"]
