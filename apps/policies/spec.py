"""The policy spec: a typed, validated schema for what a `PolicyVersion.spec` JSON may say.

Pure Python (no ORM): the validator, the overlay ("tighten, never loosen"), the help text and the
structured editor all read one declaration — the pydantic models below, their field descriptions
(help) and `json_schema_extra` (merge rule, bounds, choices), which `PolicySpec.model_json_schema()`
carries to the editor — so the editor, the validator and the merge can never disagree. pydantic
checks the structure (sections, unknown keys, required keys, paths); the leaf checks here keep
their exact messages; `validate_spec` turns a `ValidationError` into `FieldError`s with dotted paths.

Shape (every key optional; a missing key means the default shown by `default_spec()`)::

    constraints:
      max_steps / max_depth / max_parallel: {value: int|null, action: repair|block}
      workers: {allowed_workers: [key]|null, allowed_tags: [tag]|null, denied_workers: [key], action}
      confidential: {enabled, detect, detect_patterns: [regex], local_tag, action}
      caps: {max_total_tokens, max_cost_usd, max_wall_clock_s, step_timeout_s}
      forecast: {enabled, max_cost_usd, max_tokens, action: block|require_approval}
      data_boundary: {enabled, labels: [pii, secrets], inside_tags: [tag], inside_workers: [key], action}
      approval: {timeout_s, api_wait_s}
      verification: {rules: [{name, pattern}], verifier_workers: [key], verifier_tags: [tag], action}
    budgets:
      daily / monthly: {soft_usd, hard_usd}
    learning:
      {enabled, metric, max_exploration, cost_weight, latency_weight}   (the learned router, apps.learning)
    guardrails:
      on_check_error: fail_closed|fail_open
      input / step_output / output:
        pii: {enabled, action, types: [email, phone, card, iban, national_id, ip]}
        secrets: {enabled, action, types: [openai, aws, github, slack, private_key, jwt, generic]}
        injection: {enabled, action, extra_patterns: [regex]}
        blocked_terms: {enabled, action, terms: [{pattern, kind: keyword|regex, message}]}
        length: {enabled, action, max_chars}
        json_schema: {enabled, action, schema}              (output stage only)
        model_judge: {enabled, action, judges: [{name, worker, prompt}]}   (step_output, output)

**Effective policy = platform default overlaid by the team's version.** A team may tighten, never
loosen, a platform limit. Per field the merge rule (`merge` in the metadata) is one of:

- ``min``           numeric limits, caps and budgets: the smaller non-null value wins (null = no limit);
- ``stricter``      actions: the stricter one wins — constraints ``block`` > ``repair``;
                    guardrails ``block`` > ``require_review`` > ``redact`` > ``warn`` (a held
                    answer is stricter than a masked one: nothing leaves before a reviewer looks);
                    ``on_check_error`` ``fail_closed`` > ``fail_open``;
- ``or``            on/off switches (``enabled``, ``detect``): on if either side turns it on;
- ``union``         deny lists, PII/secret types, patterns, blocked terms, verification rules,
                    judges: both sides' entries apply;
- ``intersection``  allow lists (``allowed_workers``, ``allowed_tags``): only what both allow;
                    null means "no restriction" and is the neutral element. The verifier lists
                    (``verifier_workers``, ``verifier_tags``) are allow lists too — a worker that
                    counts as a verifier satisfies a rule, so more verifiers would be laxer — but
                    they only bind a side that has verification ``rules``: a side without rules
                    takes the other side's lists whole;
- ``all_of``        the output ``json_schema.schema``: both schemas apply (``{"allOf": [platform, team]}``);
- ``platform``      ``local_tag``: the platform's value when it sets one, otherwise the team's (a
                    team cannot relabel its own workers as "local hardware").

A check (any section with ``enabled``) that is disabled on one side imposes nothing: the other
side's check is taken whole, so a disabled platform check never hardens a team's ``warn`` into
the default ``block``, and a team cannot switch off a platform check.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from functools import cache
from typing import Any, Literal, TypeGuard, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

from apps.engine.text import has_bad_chars
from apps.engine.types import Limits
from apps.policies.patterns import regex_problem

ConstraintAction = Literal["repair", "block"]
PartialAnswers = Literal["allow", "deny"]
# A plan that crosses a plan-check limit: wait for an approver, or end blocked at once.
HoldAction = Literal["require_approval", "block"]
BoundaryLabel = Literal["pii", "secrets"]
GuardAction = Literal["block", "redact", "warn", "require_review"]
OnCheckError = Literal["fail_closed", "fail_open"]
TermKind = Literal["keyword", "regex"]
# A tool call (issue 43): run it, hold it for an approver first, or refuse it.
ToolAction = Literal["allow", "require_approval", "block"]

PII_TYPES = ("email", "phone", "card", "iban", "national_id", "ip")
SECRET_TYPES = ("openai", "aws", "github", "slack", "private_key", "jwt", "generic")
STAGES = ("input", "step_output", "output")

# Higher = stricter, compared only within one field's choices (the `stricter` merge rule).
# Guardrail actions: block > require_review > redact > warn (distinct ranks: a tie would let the
# platform's weaker value stand). Constraint actions: block > repair.
STRICTNESS: dict[str, int] = {
    "warn": 1,
    "repair": 1,
    "redact": 2,
    "require_review": 3,
    "require_approval": 3,
    "block": 4,
    "fail_open": 1,
    "fail_closed": 2,
    "allow": 0,
    "deny": 2,
}

# Size bounds on what a policy may store (refused at save/publish with the field path).
MAX_PATTERN_CHARS = 500  # a keyword or a regular expression
MAX_TEXT_CHARS = 300  # names, messages, keys, tags: any text field without its own bound
MAX_PROMPT_CHARS = 4000  # a model judge's rule prompt
MAX_SCHEMA_CHARS = 64 * 1024  # the output JSON schema, serialised
MAX_LIST_ITEMS = 200

# The error type this module raises inside pydantic; its context carries (sub-path, message) pairs.
_ERROR_TYPE = "policy_spec"


def _f(default: Any, help: str, merge: str, *, required: bool = False, **extra: Any) -> Any:
    """A pydantic field: `description` is the help text, `json_schema_extra` carries the merge rule
    and the validator's bounds (`minimum`, `maximum`, `regex`, `choices`, `exclude`, `max_chars`,
    `stages`, `binds_with`), so the JSON schema the editor reads holds all of them."""
    meta = {"merge": merge, **extra}
    if required:  # no default: pydantic reports the missing key ("is required")
        return Field(description=help, json_schema_extra=meta)
    if isinstance(default, type) and issubclass(default, BaseModel):  # a section: a fresh instance
        return Field(default_factory=default, description=help, json_schema_extra=meta)
    return Field(default=default, description=help, json_schema_extra=meta)


class _Spec(BaseModel):
    """Base of every spec section: immutable, unknown keys refused by name, leaf values checked
    by this module (exact messages), objects and lists of objects by pydantic."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @field_validator("*", mode="wrap")
    @classmethod
    def _check_field(cls, value: Any, handler: Callable[[Any], Any], info: ValidationInfo) -> Any:
        assert info.field_name is not None
        return _parse_field(cls.model_fields[info.field_name], value, handler)

    @model_validator(mode="after")
    def _check_object(self) -> Any:
        problems = _cross_checks(self)
        if problems:
            raise _spec_error(problems)
        return self


# ------------------------------------------------------------------------------------ constraints


class StepsLimit(_Spec):
    value: int | None = _f(
        5,
        "Most steps a conductor plan may have (per planning round). Empty: no policy limit.",
        "min",
        minimum=1,
        maximum=50,
    )
    action: ConstraintAction = _f(
        "repair", "repair: keep the first steps and the final one; block: the run ends blocked.", "stricter"
    )


class DepthLimit(_Spec):
    value: int | None = _f(
        2,
        "Most planning rounds (1 = the conductor may not re-plan itself). Empty: no policy limit.",
        "min",
        minimum=1,
        maximum=10,
    )
    action: ConstraintAction = _f(
        "repair", "repair: drop the re-planning step; block: the run ends blocked.", "stricter"
    )


class ParallelLimit(_Spec):
    value: int | None = _f(
        4, "Most steps running at the same time. Empty: no policy limit.", "min", minimum=1, maximum=64
    )
    action: ConstraintAction = _f(
        "repair",
        "repair: run the plan but at most this many steps at once; block: reject wider plans.",
        "stricter",
    )


class WorkerRule(_Spec):
    allowed_workers: tuple[str, ...] | None = _f(
        None, "Worker keys (slugs) steps may use. Empty: any worker of the pool.", "intersection"
    )
    allowed_tags: tuple[str, ...] | None = _f(
        None,
        "Steps may only use workers carrying at least one of these tags. Empty: any tag.",
        "intersection",
    )
    denied_workers: tuple[str, ...] = _f((), "Worker keys no step may ever use.", "union")
    action: ConstraintAction = _f(
        "repair", "repair: substitute an allowed worker; block: the run ends blocked.", "stricter"
    )


class ConfidentialRule(_Spec):
    enabled: bool = _f(
        False, "Confidential requests may only run on workers tagged with the local tag.", "or"
    )
    detect: bool = _f(
        False,
        "Also treat a request as confidential when it matches a detection pattern (not only when marked).",
        "or",
    )
    detect_patterns: tuple[str, ...] = _f(
        (r"\bconfidential\b", r"\binternal only\b", r"\bstrictly private\b"),
        "Regular expressions (case-insensitive) that mark a request as confidential.",
        "union",
        regex=True,
    )
    local_tag: str = _f("local", "The worker tag that means 'runs on our own hardware'.", "platform")
    action: ConstraintAction = _f(
        "repair", "repair: move the step to a local worker; block: the run ends blocked.", "stricter"
    )


class Caps(_Spec):
    max_total_tokens: int | None = _f(
        None,
        "Per run: most input+output tokens. A step is not started if its worker's max output would cross it.",
        "min",
        minimum=1,
    )
    max_cost_usd: Decimal | None = _f(
        None,
        "Per run: most spend in USD. A step is not started once the run's priced cost reaches it.",
        "min",
        minimum=0,
    )
    max_wall_clock_s: float | None = _f(None, "Per run: most seconds from start to answer.", "min", minimum=1)
    step_timeout_s: float | None = _f(
        None, "Per step: most seconds one worker call may take.", "min", minimum=1
    )


class ForecastRule(_Spec):
    enabled: bool = _f(
        False,
        "Forecast each plan's tokens and cost before any worker is called (prices from genai-prices or the "
        "worker's configured prices; output lengths from the worker's recent steps) and refuse plans "
        "forecast to cross a limit below, the per-run caps or the team's remaining budget.",
        "or",
    )
    max_cost_usd: Decimal | None = _f(
        None,
        "Most forecast spend (USD) of one plan. Empty: only the caps and budgets apply.",
        "min",
        minimum=0,
    )
    max_tokens: int | None = _f(
        None, "Most forecast input+output tokens of one plan. Empty: only the caps apply.", "min", minimum=1
    )
    action: HoldAction = _f(
        "block",
        "block: a plan over a limit ends the run blocked; require_approval: the plan waits for an "
        "approver (see constraints.approval) before any worker is called.",
        "stricter",
    )


class DataBoundary(_Spec):
    enabled: bool = _f(
        False,
        "Check where labelled data goes: a plan that sends a request an input guardrail labelled "
        "(and did not mask) to a worker outside the boundary is held or blocked.",
        "or",
    )
    labels: tuple[BoundaryLabel, ...] = _f(
        ("pii", "secrets"),
        "Which input guardrail findings bind the boundary (the pii / secrets checks must be on "
        "and not redact, or nothing stays labelled).",
        "union",
    )
    inside_tags: tuple[str, ...] = _f(
        ("local",),
        "Workers carrying any of these tags are inside the team's data boundary (both sides must agree).",
        "intersection",
    )
    inside_workers: tuple[str, ...] = _f(
        (), "Worker keys inside the boundary besides the tagged ones (both sides must agree).", "intersection"
    )
    action: HoldAction = _f(
        "require_approval",
        "require_approval: the plan waits for an approver; block: the run ends blocked.",
        "stricter",
    )


class ApprovalRule(_Spec):
    timeout_s: float | None = _f(
        3600,
        "How long a held plan waits for an approver before the run ends blocked. Empty: until decided.",
        "min",
        minimum=1,
    )
    api_wait_s: float | None = _f(
        None,
        "How long a /v1 caller waits for the decision before it gets an approval_required error "
        "(the run still resumes on approval). Empty or 0: answer at once.",
        "min",
        minimum=0,
        maximum=600,
    )


class VerificationRuleSpec(_Spec):
    name: str = _f(
        "", "A short name shown in violations, e.g. 'numbers need a check'.", "union", required=True
    )
    pattern: str = _f(
        "",
        "Regular expression (case-insensitive); a matching request must end with a verifier step.",
        "union",
        regex=True,
        required=True,
    )


class Verification(_Spec):
    rules: tuple[VerificationRuleSpec, ...] = _f(
        (), "Requests matching any rule must end with a step on a verifier worker.", "union"
    )
    verifier_workers: tuple[str, ...] = _f(
        (),
        "Worker keys that count as verifiers (with rules on both sides: only keys both accept).",
        "intersection",
        binds_with="rules",
    )
    verifier_tags: tuple[str, ...] = _f(
        ("verifier",),
        "Workers with any of these tags count as verifiers (with rules on both sides: only tags both accept).",
        "intersection",
        binds_with="rules",
    )
    action: ConstraintAction = _f(
        "repair",
        "repair: append a verification step on a verifier worker; block: the run ends blocked.",
        "stricter",
    )


class Constraints(_Spec):
    max_steps: StepsLimit = _f(StepsLimit, "Plan size limit.", "nested")
    max_depth: DepthLimit = _f(DepthLimit, "Recursion (re-planning) limit.", "nested")
    max_parallel: ParallelLimit = _f(ParallelLimit, "Concurrency limit.", "nested")
    workers: WorkerRule = _f(WorkerRule, "Which workers steps may use.", "nested")
    confidential: ConfidentialRule = _f(
        ConfidentialRule, "Confidential data stays on local workers.", "nested"
    )
    caps: Caps = _f(Caps, "Per-run caps, checked before every step.", "nested")
    forecast: ForecastRule = _f(ForecastRule, "Plan checks: forecast before execution.", "nested")
    data_boundary: DataBoundary = _f(
        DataBoundary, "Plan checks: labelled data stays inside the team's data boundary.", "nested"
    )
    approval: ApprovalRule = _f(ApprovalRule, "Plans held for an approver.", "nested")
    verification: Verification = _f(Verification, "Required verification steps.", "nested")
    partial_answers: PartialAnswers = _f(
        "allow",
        "allow: a run whose plan cannot finish (a step failed after its retries and fallback) but "
        "that holds the answer of an earlier completed round returns it, marked incomplete on every "
        "surface and checked by the output guardrails like any answer; deny: such a run ends failed.",
        "stricter",
    )


# ------------------------------------------------------------------------------------ budgets


class BudgetLimit(_Spec):
    soft_usd: Decimal | None = _f(
        None, "Spend (USD) after which runs are flagged with a warning.", "min", minimum=0
    )
    hard_usd: Decimal | None = _f(
        None, "Spend (USD) after which new runs are refused until the reset.", "min", minimum=0
    )


class Budgets(_Spec):
    daily: BudgetLimit = _f(BudgetLimit, "Per UTC day; resets at 00:00 UTC.", "nested")
    monthly: BudgetLimit = _f(
        BudgetLimit, "Per UTC calendar month; resets at 00:00 UTC on the 1st.", "nested"
    )


# ------------------------------------------------------------------------------------ learning


class Learning(_Spec):
    """The learned router (strategy ``learned``): a per-team contextual bandit over strategies."""

    enabled: bool = _f(
        False,
        "The learned router learns from feedback and explores. Off: runs with strategy 'learned' are "
        "still routed, greedily, by the router as it stands (it never explores or learns).",
        "or",
    )
    metric: str = _f(
        "",
        "The feedback metric the router learns from. Empty: 'helpful' (the thumbs control). The "
        "platform's choice wins when it names one, so every team is scored the same way.",
        "platform",
    )
    max_exploration: float = _f(
        0.1,
        "Largest share (0-1) of the team's routed runs that may try an arm other than the best "
        "known one; at the share, the router only exploits.",
        "min",
        minimum=0,
        maximum=1,
    )
    cost_weight: float | None = _f(
        None,
        "Reward = metric - cost_weight x normalised cost - latency_weight x normalised latency (the "
        "paper's limited-budget dial). The trade-off is the organisation's: the platform's weight "
        "wins when it sets one, otherwise the team's. Empty: 0 (cost does not count).",
        "platform",
        minimum=0,
        maximum=10,
    )
    latency_weight: float | None = _f(
        None,
        "Weight of the normalised latency in the reward (see cost_weight); platform's value wins "
        "when set. Empty: 0.",
        "platform",
        minimum=0,
        maximum=10,
    )


# ------------------------------------------------------------------------------------ guardrails

_ACTION_HELP = "block: stop; redact: mask the finding before anyone sees it; warn: flag the run; require_review: hold the answer for a reviewer."


class PiiCheck(_Spec):
    enabled: bool = _f(False, "Detect personal data.", "or")
    action: GuardAction = _f("redact", _ACTION_HELP, "stricter")
    types: tuple[str, ...] = _f(
        PII_TYPES, "Which kinds: " + ", ".join(PII_TYPES) + ".", "union", choices=PII_TYPES
    )


class SecretsCheck(_Spec):
    enabled: bool = _f(False, "Detect API keys, private keys and tokens.", "or")
    action: GuardAction = _f("block", _ACTION_HELP, "stricter")
    types: tuple[str, ...] = _f(
        SECRET_TYPES, "Which kinds: " + ", ".join(SECRET_TYPES) + ".", "union", choices=SECRET_TYPES
    )


class InjectionCheck(_Spec):
    enabled: bool = _f(False, "Heuristics for prompt injection and jailbreak attempts.", "or")
    action: GuardAction = _f("block", _ACTION_HELP + " (redact removes the matching phrase)", "stricter")
    extra_patterns: tuple[str, ...] = _f(
        (), "Extra regular expressions (case-insensitive) that count as injection.", "union", regex=True
    )


class TermRule(_Spec):
    pattern: str = _f(
        "",
        "A keyword (whole word, case-insensitive) or a regular expression.",
        "union",
        required=True,
        max_chars=MAX_PATTERN_CHARS,
    )
    kind: TermKind = _f("keyword", "keyword or regex.", "union")
    message: str = _f("", "What the user is told when this term is found (default: 'blocked term').", "union")


class BlockedTermsCheck(_Spec):
    enabled: bool = _f(False, "Block topics or terms.", "or")
    action: GuardAction = _f("block", _ACTION_HELP, "stricter")
    terms: tuple[TermRule, ...] = _f((), "The terms; each with its own message.", "union")


class LengthCheck(_Spec):
    enabled: bool = _f(False, "Limit the text length.", "or")
    action: GuardAction = _f(
        "block", "block, warn or require_review (redact truncates to the limit).", "stricter"
    )
    max_chars: int | None = _f(None, "Most characters allowed.", "min", minimum=1)


# The stored key is `schema`, which shadows BaseModel's deprecated `schema()` classmethod; the
# spec never calls that method, so the field keeps its name (and callers their attribute).
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message='Field name "schema"', category=UserWarning)

    class JsonSchemaCheck(_Spec):
        enabled: bool = _f(
            False, "The final answer must be JSON matching the schema (output stage only).", "or"
        )
        action: GuardAction = _f("block", "block, warn or require_review.", "stricter", exclude=("redact",))
        schema: dict[str, Any] | None = _f(None, "A JSON Schema (draft 2020-12) object.", "all_of")  # type: ignore[assignment]


class Judge(_Spec):
    name: str = _f("", "A short name, e.g. 'no financial advice'.", "union", required=True)
    worker: str = _f("", "Key of the pool worker that judges.", "union", required=True)
    prompt: str = _f(
        "",
        "The rule the judge applies, e.g. 'The answer gives no personal financial advice.'",
        "union",
        required=True,
        max_chars=MAX_PROMPT_CHARS,
    )


class ModelJudgeCheck(_Spec):
    enabled: bool = _f(
        False, "A chosen worker judges the text against policy prompts (pass/fail + reason).", "or"
    )
    action: GuardAction = _f("block", "block, warn or require_review.", "stricter", exclude=("redact",))
    judges: tuple[Judge, ...] = _f((), "The judges to run.", "union")


class StageGuardrails(_Spec):
    pii: PiiCheck = _f(
        PiiCheck,
        "Personal data: e-mail, phone, payment card (Luhn), IBAN (mod 97), national IDs, IP addresses.",
        "nested",
    )
    secrets: SecretsCheck = _f(
        SecretsCheck, "Secrets: sk-…, AKIA…, ghp_…, xox…, private key blocks, JWTs.", "nested"
    )
    injection: InjectionCheck = _f(InjectionCheck, "Prompt injection / jailbreak heuristics.", "nested")
    blocked_terms: BlockedTermsCheck = _f(BlockedTermsCheck, "Blocked topics and terms.", "nested")
    length: LengthCheck = _f(LengthCheck, "Length limit.", "nested")
    json_schema: JsonSchemaCheck = _f(
        JsonSchemaCheck, "JSON schema (output only).", "nested", stages=("output",)
    )
    model_judge: ModelJudgeCheck = _f(
        ModelJudgeCheck, "Model-judged checks.", "nested", stages=("step_output", "output")
    )


class Guardrails(_Spec):
    on_check_error: OnCheckError = _f(
        "fail_closed",
        "When a check itself breaks: fail_closed blocks (default); fail_open lets the text through, recorded as bypassed.",
        "stricter",
    )
    input: StageGuardrails = _f(StageGuardrails, "Checks on the request before any worker sees it.", "nested")
    step_output: StageGuardrails = _f(
        StageGuardrails, "Checks on each worker's output before later steps read it.", "nested"
    )
    output: StageGuardrails = _f(StageGuardrails, "Checks on the final answer.", "nested")


# ------------------------------------------------------------------------------------ tools


class ToolRule(_Spec):
    """One rule for one tool. Several rules may name the same tool (the platform's and the team's,
    or one per argument): every one of them applies, so adding a rule can only tighten."""

    tool: str = _f("", "The tool, as <server slug>.<tool name> (e.g. crm.lookup).", "union", required=True)
    action: ToolAction = _f(
        "allow",
        "allow: run it; require_approval: the call waits for an approver and then runs exactly the "
        "approved arguments; block: refuse it.",
        "union",
    )
    argument: str = _f("", "An argument this rule constrains (empty: none).", "union")
    pattern: str = _f(
        "",
        "Regular expression the argument's value (as text) must match in full; a call without the "
        "argument or with a value that does not match is refused.",
        "union",
        regex=True,
    )
    max_calls_per_run: int | None = _f(None, "Most calls of this tool in one run.", "union", minimum=1)
    max_calls_per_hour: int | None = _f(
        None, "Most calls of this tool by the team in any rolling hour (the rate limit).", "union", minimum=1
    )
    cost_per_call_usd: Decimal | None = _f(
        None,
        "What one call costs (USD); counted into the run's cost and the daily limit.",
        "union",
        minimum=0,
    )
    max_cost_usd_per_day: Decimal | None = _f(
        None, "Most spend (USD) on this tool by the team per UTC day (the cost limit).", "union", minimum=0
    )


class ToolOutputInjection(InjectionCheck):
    enabled: bool = _f(True, "Heuristics for instructions smuggled into a tool's output.", "or")


class ToolOutputChecks(_Spec):
    injection: ToolOutputInjection = _f(
        ToolOutputInjection,
        "Indirect prompt injection in what a tool returned (block: no model reads it; redact: the "
        "phrase is removed; require_review: the output is held and the call flagged).",
        "nested",
    )
    pii: PiiCheck = _f(PiiCheck, "Personal data in what a tool returned.", "nested")
    secrets: SecretsCheck = _f(SecretsCheck, "Secrets in what a tool returned.", "nested")


class ToolsPolicy(_Spec):
    allowed_tools: tuple[str, ...] | None = _f(
        None,
        "Tools (<server>.<tool>) the team may call. Empty: every accepted tool of the team's and "
        "the platform's servers.",
        "intersection",
    )
    denied_tools: tuple[str, ...] = _f((), "Tools no call may ever use.", "union")
    default_action: ToolAction = _f(
        "allow",
        "The action for an allowed tool that no rule names: allow, require_approval or block.",
        "stricter",
    )
    rules: tuple[ToolRule, ...] = _f(
        (), "Per-tool actions, argument patterns, rate and cost limits.", "union"
    )
    max_calls_per_run: int | None = _f(
        20, "Most tool calls of any tool in one run.", "min", minimum=1, maximum=1000
    )
    output: ToolOutputChecks = _f(
        ToolOutputChecks, "Checks on every tool output before any model (or /mcp client) reads it.", "nested"
    )


class PolicySpec(_Spec):
    constraints: Constraints = _f(
        Constraints, "Workflow constraints, checked at plan time and before every step.", "nested"
    )
    budgets: Budgets = _f(Budgets, "Team spend limits.", "nested")
    learning: Learning = _f(Learning, "The learned router: exploration, reward and metric.", "nested")
    guardrails: Guardrails = _f(Guardrails, "Guardrails per stage.", "nested")
    tools: ToolsPolicy = _f(
        ToolsPolicy, "Governed tools (MCP): which tools, with what arguments, how often.", "nested"
    )


# ------------------------------------------------------------------------------------ validation


@dataclass(frozen=True, slots=True)
class FieldError:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class SpecError(ValueError):
    def __init__(self, errors: list[FieldError]) -> None:
        super().__init__("; ".join(str(e) for e in errors))
        self.errors = errors


# (path relative to where pydantic reports the error: "", "[3]" or "soft_usd", message)
Problems = list[tuple[str, str]]


def _spec_error(problems: Problems) -> PydanticCustomError:
    detail = "; ".join(f"{p}: {m}" if p else m for p, m in problems)
    return PydanticCustomError(_ERROR_TYPE, "{detail}", {"detail": detail, "problems": problems})


def _meta(f: FieldInfo) -> dict[str, Any]:
    extra = f.json_schema_extra
    return dict(extra) if isinstance(extra, dict) else {}


def field_meta(cls: type[BaseModel], name: str) -> dict[str, Any]:
    """A field's merge rule and bounds (its `json_schema_extra`)."""
    return _meta(cls.model_fields[name])


def is_section(tp: Any) -> TypeGuard[type[BaseModel]]:
    """True for a spec section type (a nested model), false for a leaf type."""
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _item_model(tp: Any) -> type[BaseModel] | None:
    """The entry model of a list-of-objects field (rules, terms, judges), else None."""
    args = get_args(tp)
    return args[0] if get_origin(tp) is tuple and args and is_section(args[0]) else None


@dataclass(frozen=True, slots=True)
class SpecField:
    """One field of a spec section: what the merge property test and the help read."""

    name: str
    type: Any
    help: str
    metadata: dict[str, Any]


def spec_fields(cls_or_obj: Any) -> list[SpecField]:
    """The fields of a spec section (a model class or instance), in declaration order."""
    cls: type[BaseModel] = cls_or_obj if isinstance(cls_or_obj, type) else type(cls_or_obj)
    return [SpecField(n, f.annotation, f.description or "", _meta(f)) for n, f in cls.model_fields.items()]


def _hints(cls: type[BaseModel]) -> dict[str, Any]:
    return {name: f.annotation for name, f in cls.model_fields.items()}


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _sub(path: str, sub: str) -> str:
    if not sub:
        return path
    return path + sub if sub.startswith("[") else _join(path, sub)


def _type_name(value: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "true/false", type(None): "null"}.get(
        type(value), type(value).__name__
    )


def _parse_field(f: FieldInfo, value: Any, handler: Callable[[Any], Any]) -> Any:
    """One field of a section: sections and entries of object lists go to pydantic (which reports
    their paths); leaves are checked here, so each message says exactly what is wrong."""
    tp = f.annotation
    if is_section(tp):
        return handler(value)
    if _item_model(tp) is not None:
        if not isinstance(value, list | tuple):
            raise _spec_error([("", f"must be a list, got {_type_name(value)}")])
        if len(value) > MAX_LIST_ITEMS:
            raise _spec_error([("", f"has {len(value)} entries; at most {MAX_LIST_ITEMS} are allowed")])
        out: list[Any] = []
        for entry in handler(value):
            if entry not in out:
                out.append(entry)
        return tuple(out)
    problems: Problems = []
    parsed = _parse_value(tp, value, "", {**_meta(f), "required": f.is_required()}, problems)
    if problems:
        raise _spec_error(problems)
    return parsed


def _parse_value(tp: Any, value: Any, path: str, meta: Mapping[str, Any], problems: Problems) -> Any:
    origin = get_origin(tp)
    args = get_args(tp)
    if origin in (typing.Union, types.UnionType):
        non_none = [a for a in args if a is not type(None)]
        if value is None:
            return None
        return _parse_value(non_none[0], value, path, meta, problems)
    if origin is Literal:
        if value not in args:
            problems.append((path, f"must be one of {', '.join(map(str, args))}; got {value!r}"[:300]))
            return None
        excluded = meta.get("exclude", ())
        if value in excluded:
            allowed = [a for a in args if a not in excluded]
            problems.append((path, f"{value!r} is not available for this check; choose {', '.join(allowed)}"))
            return None
        return value
    if tp is bool:
        if not isinstance(value, bool):
            problems.append((path, f"must be true or false, got {_type_name(value)}"))
            return None
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append((path, f"must be a whole number, got {value!r}"[:200]))
            return None
        return _bounds(value, path, meta, problems)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            problems.append((path, f"must be a number, got {value!r}"[:200]))
            return None
        return _bounds(float(value), path, meta, problems)
    if tp is Decimal:
        return _parse_decimal(value, path, meta, problems)
    if tp is str:
        return _parse_text(value, path, meta, problems)
    if origin is tuple:
        return _parse_list(args[0], value, path, meta, problems)
    if origin is dict:
        if not isinstance(value, dict):
            problems.append((path, f"must be an object, got {_type_name(value)}"))
            return None
        problem = _json_schema_problem(value)  # the one object-valued leaf: the output JSON schema
        if problem:
            problems.append((path, problem))
        return value
    raise TypeError(f"unsupported spec type {tp!r} at {path}")  # a bug in this module, not user input


def _parse_decimal(value: Any, path: str, meta: Mapping[str, Any], problems: Problems) -> Any:
    bad = f'must be an amount in USD, e.g. 5 or "2.50"; got {value!r}'[:200]
    # A Decimal comes back when a parsed spec is validated again (model_copy, merge results).
    if isinstance(value, bool) or not isinstance(value, int | float | str | Decimal):
        problems.append((path, bad))
        return None
    try:
        dec = Decimal(str(value))
    except InvalidOperation:
        problems.append((path, bad))
        return None
    if not dec.is_finite():
        problems.append((path, "must be a finite amount"))
        return None
    return _bounds(dec, path, meta, problems)


def _parse_text(value: Any, path: str, meta: Mapping[str, Any], problems: Problems) -> Any:
    if not isinstance(value, str):
        problems.append((path, f"must be a string, got {_type_name(value)}"))
        return None
    limit = meta.get("max_chars") or (MAX_PATTERN_CHARS if meta.get("regex") else MAX_TEXT_CHARS)
    if len(value) > limit:
        problems.append((path, f"is {len(value)} characters long; at most {limit} are allowed"))
        return None
    if has_bad_chars(value):
        problems.append((path, "must not contain NUL characters or unpaired surrogates"))
        return None
    if meta.get("required") and not value.strip():
        problems.append((path, "must not be empty"))
        return None
    if meta.get("regex"):
        problem = _regex_problem(value)
        if problem:
            problems.append((path, problem))
    return value


def _parse_list(item_tp: Any, value: Any, path: str, meta: Mapping[str, Any], problems: Problems) -> Any:
    if not isinstance(value, list | tuple):
        problems.append((path, f"must be a list, got {_type_name(value)}"))
        return None
    if len(value) > MAX_LIST_ITEMS:
        problems.append((path, f"has {len(value)} entries; at most {MAX_LIST_ITEMS} are allowed"))
        return None
    out: list[Any] = []
    choices = meta.get("choices")
    item_meta = {k: v for k, v in meta.items() if k in ("regex",)}
    for i, item in enumerate(value):
        p = _join(path, i)
        if item_tp is str and isinstance(item, str) and not item.strip():
            problems.append((p, "must not be empty"))
            continue
        before = len(problems)
        parsed = _parse_value(item_tp, item, p, item_meta, problems)
        if parsed is None or len(problems) > before:
            continue
        if choices is not None and parsed not in choices:
            problems.append((p, f"unknown value {parsed!r}; choose from {', '.join(choices)}"[:300]))
            continue
        if parsed not in out:
            out.append(parsed)
    return tuple(out)


def _bounds(value: Any, path: str, meta: Mapping[str, Any], problems: Problems) -> Any:
    lo, hi = meta.get("minimum"), meta.get("maximum")
    if lo is not None and value < lo:
        problems.append((path, f"must be at least {lo}, got {value}"))
        return None
    if hi is not None and value > hi:
        problems.append((path, f"must be at most {hi}, got {value}"))
        return None
    return value


def _regex_problem(pattern: str) -> str | None:
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"the pattern is longer than {MAX_PATTERN_CHARS} characters"
    # Policy patterns run on RE2 (linear time); what RE2 refuses cannot be published.
    problem = regex_problem(pattern)
    if problem is not None:
        return f"invalid regular expression for RE2 (linear-time matching): {problem}"[:300]
    return None


def _json_schema_problem(schema: dict[str, Any]) -> str | None:
    import jsonschema

    try:
        size = len(json.dumps(schema))
    except (TypeError, ValueError, RecursionError):
        return "must be a JSON object"
    if size > MAX_SCHEMA_CHARS:
        return f"is {size} characters as JSON; at most {MAX_SCHEMA_CHARS} are allowed"
    stack: list[Any] = [schema]
    while stack:  # iterative: the loaders bound the depth, this must not recurse on it either
        node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, value in items:
            if (isinstance(key, str) and has_bad_chars(key)) or (
                isinstance(value, str) and has_bad_chars(value)
            ):
                return "must not contain NUL characters or unpaired surrogates"
            if isinstance(value, dict | list):
                stack.append(value)
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as err:
        where = "/".join(str(p) for p in err.path)
        return f"invalid JSON schema{(' at ' + where) if where else ''}: {err.message}"[:300]
    return None


def _stage_problems(guardrails: Any) -> Problems:
    """Checks enabled in a stage that does not offer them (on the raw or the dumped guardrails:
    serialised specs carry every check in every stage; only enabling one is an error)."""
    problems: Problems = []
    if not isinstance(guardrails, Mapping):
        return problems
    for stage in STAGES:
        checks = guardrails.get(stage)
        if not isinstance(checks, Mapping):
            continue
        for name, f in StageGuardrails.model_fields.items():
            stages = _meta(f).get("stages")
            check = checks.get(name)
            if stages and stage not in stages and isinstance(check, Mapping) and check.get("enabled") is True:
                problems.append(
                    (
                        f"{stage}.{name}",
                        f"this check is only available in the {' and '.join(stages)} stage(s)",
                    )
                )
    return problems


def _cross_checks(obj: Any) -> Problems:
    """Rules that span several fields of one object (run once its fields are valid)."""
    problems: Problems = []
    if isinstance(obj, Guardrails):
        problems.extend(_stage_problems(obj.model_dump()))
    if (
        isinstance(obj, BudgetLimit)
        and obj.soft_usd is not None
        and obj.hard_usd is not None
        and obj.soft_usd > obj.hard_usd
    ):
        problems.append(
            ("soft_usd", f"the soft limit ({obj.soft_usd}) is above the hard limit ({obj.hard_usd})")
        )
    if isinstance(obj, LengthCheck) and obj.enabled and obj.max_chars is None:
        problems.append(("max_chars", "is required when the length check is enabled"))
    if isinstance(obj, JsonSchemaCheck) and obj.enabled and obj.schema is None:
        problems.append(("schema", "is required when the JSON schema check is enabled"))
    if isinstance(obj, ModelJudgeCheck) and obj.enabled and not obj.judges:
        problems.append(("judges", "add at least one judge when the check is enabled"))
    if isinstance(obj, BlockedTermsCheck) and obj.enabled and not obj.terms:
        problems.append(("terms", "add at least one term when the check is enabled"))
    if isinstance(obj, TermRule) and obj.kind == "regex":
        problem = _regex_problem(obj.pattern)
        if problem:
            problems.append(("pattern", problem))
    if isinstance(obj, ToolRule):
        if "." not in obj.tool.strip("."):
            problems.append(("tool", "name the tool as <server slug>.<tool name>"))
        if bool(obj.argument) != bool(obj.pattern):
            problems.append(("pattern", "give both an argument and its pattern, or neither"))
        elif obj.pattern:
            problem = _regex_problem(obj.pattern)
            if problem:
                problems.append(("pattern", problem))
    if isinstance(obj, WorkerRule):
        both = sorted(set(obj.allowed_workers or ()) & set(obj.denied_workers))
        if both:
            problems.append(("denied_workers", f"{', '.join(both)} is both allowed and denied"))
    return problems


def _loc_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for key in loc:
        path = _join(path, key)
    return path


def _model_at(loc: tuple[int | str, ...]) -> type[BaseModel]:
    """The section class at a pydantic error location (to list its known fields)."""
    cls: type[BaseModel] = PolicySpec
    for key in loc:
        f = cls.model_fields.get(key) if isinstance(key, str) else None
        tp = f.annotation if f is not None else None
        if is_section(tp):
            cls = tp
        elif f is not None:
            cls = _item_model(tp) or cls
    return cls


def _field_errors(exc: ValidationError) -> list[FieldError]:
    """pydantic's errors in this module's format: the dotted field path and what is wrong."""
    errors: list[FieldError] = []
    for e in exc.errors(include_url=False):
        loc, kind, ctx = e["loc"], e["type"], e.get("ctx") or {}
        path = _loc_path(loc)
        if kind == _ERROR_TYPE:
            errors.extend(FieldError(_sub(path, sub), message) for sub, message in ctx["problems"])
        elif kind == "extra_forbidden":
            known = ", ".join(_model_at(loc[:-1]).model_fields)
            where = _join(_loc_path(loc[:-1]), str(loc[-1])[:100])
            errors.append(FieldError(where, f"unknown field (known: {known})"))
        elif kind == "missing":
            errors.append(FieldError(path, "is required"))
        elif kind in ("model_type", "model_attributes_type", "dict_type"):
            errors.append(FieldError(path, f"must be an object, got {_type_name(e['input'])}"))
        else:  # pragma: no cover — every leaf is checked by this module
            errors.append(FieldError(path, e["msg"]))
    return errors


def validate_spec(data: Any) -> tuple[PolicySpec | None, list[FieldError]]:
    """Validate raw JSON data; return (spec, []) or (None, every error with its field path)."""
    try:
        spec = PolicySpec.model_validate(data)
    except ValidationError as exc:
        errors = _field_errors(exc)
        # A section with a bad field skips its cross-field rules; the stage rule reads raw data.
        guardrails = data.get("guardrails") if isinstance(data, Mapping) else None
        for sub, message in _stage_problems(guardrails):
            path = _join("guardrails", sub)
            if not any(e.path == path for e in errors):
                errors.append(FieldError(path, message))
        return None, errors
    return spec, []


def parse_spec(data: Any) -> PolicySpec:
    """Like `validate_spec` but raises `SpecError` listing every error."""
    spec, errors = validate_spec(data)
    if errors or spec is None:
        raise SpecError(errors)
    return spec


@cache
def policy_json_schema() -> dict[str, Any]:
    """The spec's JSON Schema (help text, merge rules and bounds included): the editor's source."""
    return PolicySpec.model_json_schema()


# ------------------------------------------------------------------------------------ serialisation


def spec_to_dict(obj: Any) -> Any:
    """JSON-safe dict of a spec (Decimals as strings, tuples as lists)."""
    if isinstance(obj, BaseModel):
        return {name: spec_to_dict(getattr(obj, name)) for name in type(obj).model_fields}
    if isinstance(obj, tuple | list):
        return [spec_to_dict(v) for v in obj]
    if isinstance(obj, Decimal):
        return str(obj)
    return obj


def default_spec() -> PolicySpec:
    return PolicySpec()


# ------------------------------------------------------------------------------------ overlay


def _merge_value(rule: str, platform: Any, team: Any) -> Any:
    if rule == "nested":
        return _merge_section(platform, team)
    if rule == "min":
        if platform is None:
            return team
        if team is None:
            return platform
        return min(platform, team)
    if rule == "stricter":
        return team if STRICTNESS.get(team, 0) > STRICTNESS.get(platform, 0) else platform
    if rule == "or":
        return bool(platform) or bool(team)
    if rule == "union":
        return tuple(dict.fromkeys([*platform, *team]))
    if rule == "intersection":
        if platform is None:
            return team
        if team is None:
            return platform
        return tuple(v for v in platform if v in set(team))
    if rule == "all_of":
        if platform in (None, {}) or platform == team:
            return team
        if team in (None, {}):
            return platform
        return {"allOf": [platform, team]}
    if rule == "platform":
        return platform if platform not in (None, "") else team
    raise ValueError(f"unknown merge rule {rule!r}")  # a bug in this module


def _merge_section(platform: Any, team: Any) -> Any:
    fields = type(platform).model_fields
    # A disabled check imposes nothing: merging its default action ("block") with an enabled
    # team check would silently turn the team's warn/require_review into a block.
    if "enabled" in fields:
        if not platform.enabled:
            return team
        if not team.enabled:
            return platform
    merged = {}
    for name, f in fields.items():
        meta = _meta(f)
        p, t = getattr(platform, name), getattr(team, name)
        binds_with = meta.get("binds_with")
        # A side without the sibling entries (e.g. no verification rules) imposes nothing here.
        if binds_with and not getattr(platform, binds_with):
            merged[name] = t
        elif binds_with and not getattr(team, binds_with):
            merged[name] = p
        else:
            merged[name] = _merge_value(meta["merge"], p, t)
    # Both sides were validated; the merge of two valid sections is not validated again (as before).
    return type(platform).model_construct(**merged)


def merge_specs(platform: PolicySpec, team: PolicySpec | None) -> PolicySpec:
    """Overlay the team's spec on the platform default: tighten, never loosen (see module doc)."""
    if team is None:
        return platform
    merged: PolicySpec = _merge_section(platform, team)
    return merged


# ------------------------------------------------------------------------------------ help


MERGE_RULE_TEXT = {
    "min": "team may only lower it (smaller limit wins)",
    "stricter": "the stricter of platform and team wins",
    "or": "on if the platform or the team turns it on",
    "union": "platform and team entries both apply",
    "intersection": "only what both platform and team allow",
    "all_of": "both the platform's and the team's apply",
    "platform": "the platform's value wins when it sets one",
}


@dataclass(frozen=True, slots=True)
class FieldHelp:
    path: str
    help: str
    merge: str
    rule_text: str
    type_text: str
    default: Any


def _type_text(tp: Any) -> str:
    origin, args = get_origin(tp), get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _type_text(inner[0]) + " or empty"
    if origin is Literal:
        return " | ".join(map(str, args))
    if origin is tuple:
        return f"list of {_type_text(args[0])}"
    if is_section(tp):
        return "object"
    return {bool: "true/false", int: "whole number", float: "number", Decimal: "USD amount", str: "text"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def iter_field_help(cls: type[BaseModel] | None = None, prefix: str = "") -> Iterator[FieldHelp]:
    """Every field of the spec with its help text and merge rule, in declaration order."""
    for name, f in (cls or PolicySpec).model_fields.items():
        path = _join(prefix, name)
        tp, merge, help_text = f.annotation, _meta(f)["merge"], f.description or ""
        if merge == "nested":
            yield FieldHelp(path, help_text, merge, "", "section", None)
            yield from iter_field_help(tp, path)  # type: ignore[arg-type]
            continue
        default = "" if f.is_required() else f.get_default(call_default_factory=True)
        yield FieldHelp(path, help_text, merge, MERGE_RULE_TEXT[merge], _type_text(tp), spec_to_dict(default))
        item = _item_model(tp)
        if item is not None:
            yield from iter_field_help(item, path + "[]")


def field_help_map() -> dict[str, FieldHelp]:
    return {h.path: h for h in iter_field_help()}


# ------------------------------------------------------------------------------------ diff


def diff_dicts(old: Any, new: Any, path: str = "") -> list[dict[str, Any]]:
    """Leaf-level differences between two JSON values: [{path, old, new}] (missing = None)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[dict[str, Any]] = []
        for key in list(dict.fromkeys([*old, *new])):
            out.extend(diff_dicts(old.get(key), new.get(key), _join(path, str(key))))
        return out
    if old != new:
        return [{"path": path or "(root)", "old": old, "new": new}]
    return []


def walk(obj: Any, fn: Callable[[str, Any], None], path: str = "") -> None:
    """Call fn(path, leaf) for every leaf of a spec dict (used by the structured summary)."""
    if isinstance(obj, dict) and not path.endswith("schema"):
        for k, v in obj.items():
            walk(v, fn, _join(path, k))
    else:
        fn(path, obj)


# ------------------------------------------------------------------------------------ effective


PLAN_ENVELOPE_STEPS = 8  # the engine's parse bound when the policy limits steps (see engine_limits)


@dataclass(frozen=True)
class EffectivePolicy:
    """The merged spec in force for a team, and the version it came from.

    `version` is the team's current `PolicyVersion` when the team has one, else the platform
    default's current version, else None (built-in defaults). `platform_version` is recorded
    too because the team's rules are overlaid on it."""

    spec: PolicySpec
    version: Any = None
    platform_version: Any = None
    team_id: int | None = None

    @property
    def version_id(self) -> int | None:
        return getattr(self.version, "pk", None)

    def engine_limits(self) -> Any:
        """`apps.engine.types.Limits` narrowed by the policy.

        The conductor is told the policy's step limit (``max_steps``), while the parser accepts
        plans up to PLAN_ENVELOPE_STEPS (``accept_steps``) so an over-long conductor plan reaches
        `validate_plan`, where the policy repairs or blocks it with a precise violation; presets
        may narrow ``max_steps`` further. Depth, parallelism and the time caps are enforced by
        the engine directly."""
        base = Limits()
        c = self.spec.constraints
        kwargs: dict[str, Any] = {}
        if c.max_steps.value is not None:
            kwargs["max_steps"] = min(base.max_steps, c.max_steps.value)
            kwargs["accept_steps"] = max(c.max_steps.value, PLAN_ENVELOPE_STEPS)
        if c.max_depth.value is not None:
            kwargs["max_depth"] = min(base.max_depth, c.max_depth.value)
        if c.max_parallel.value is not None:
            kwargs["max_parallel"] = min(base.max_parallel, c.max_parallel.value)
        if c.caps.step_timeout_s is not None:
            kwargs["step_timeout_s"] = min(base.step_timeout_s, c.caps.step_timeout_s)
        if c.caps.max_wall_clock_s is not None:
            kwargs["run_timeout_s"] = min(base.run_timeout_s, c.caps.max_wall_clock_s)
        kwargs["partial_answers"] = c.partial_answers == "allow"
        return dataclasses.replace(base, **kwargs)


def inert_fields(spec: PolicySpec) -> list[dict[str, str]]:
    """Configured but without effect (issue 42): a field set away from its default inside a
    section that is switched off (``enabled: false``), e.g. ``constraints.forecast.max_tokens``
    with the forecast disabled. ``[{path, why}]``, for the editor's review and Summary."""
    found: list[dict[str, str]] = []

    def visit(obj: Any, path: str) -> None:
        if not isinstance(obj, BaseModel):
            return
        fields = type(obj).model_fields
        if "enabled" in fields and obj.enabled is False:  # type: ignore[attr-defined]
            try:
                default = type(obj)()
            except ValidationError:
                return  # a section without defaults: nothing to compare with
            for name in fields:
                if name != "enabled" and getattr(obj, name) != getattr(default, name):
                    found.append(
                        {
                            "path": f"{path}.{name}",
                            "why": f"{path}.enabled is off, so {path}.{name} has no effect until it is turned on",
                        }
                    )
            return
        for name in fields:
            visit(getattr(obj, name), _join(path, name) if path else name)

    visit(spec, "")
    return found


def _value_text(value: Any) -> str:
    data = spec_to_dict(value)
    if data is None:
        return "no limit"
    if isinstance(data, bool):
        return "on" if data else "off"
    if isinstance(data, list | tuple):
        return ", ".join(str(v) if not isinstance(v, dict | list) else json.dumps(v) for v in data) or "none"
    return str(data)


def _default_of(section: Any) -> Any:
    try:
        return type(section)()
    except ValidationError:
        return None  # a section without defaults (a list item): every value counts as set


def shadowed_fields(
    platform: PolicySpec, team: PolicySpec, *, winner: str = "the platform default"
) -> list[dict[str, str]]:
    """Configured in the team's layer but overridden by the stricter platform layer (issue 42):
    a field the team sets away from its default whose merged value is not the team's, e.g. a
    team's ``max_steps.value: 8`` under a platform ``5``. (Stored specs are normalised, every
    field written out, so "configured" means "not the default".) Fields whose merge keeps both
    sides (``union``, ``all_of``) are never shadowed. ``[{path, team, effective, winner, why}]``
    in spec order; ``winner`` names the layer that wins."""
    found: list[dict[str, str]] = []

    def flag(path: str, rule: str, team_value: Any, merged: Any) -> None:
        team_text, merged_text = _value_text(team_value), _value_text(merged)
        found.append(
            {
                "path": path,
                "team": team_text,
                "effective": merged_text,
                "winner": winner,
                "why": f"{winner} wins: {merged_text} is in force, not {team_text} — {MERGE_RULE_TEXT[rule]}",
            }
        )

    def configured(t: Any, default: Any, name: str) -> bool:
        return default is None or spec_to_dict(getattr(t, name)) != spec_to_dict(getattr(default, name))

    def visit(p: Any, t: Any, path: str) -> None:
        fields = type(t).model_fields
        default = _default_of(t)
        if "enabled" in fields:
            if not p.enabled:
                return  # the platform's check is off: the team's is taken whole
            if not t.enabled:
                # The platform's check is taken whole: a team cannot switch it off.
                if configured(t, default, "enabled"):
                    flag(_join(path, "enabled"), "or", False, True)
                return
        for name, f in fields.items():
            meta = _meta(f)
            rule = meta["merge"]
            sub = _join(path, name) if path else name
            pv, tv = getattr(p, name), getattr(t, name)
            if rule == "nested":
                visit(pv, tv, sub)
                continue
            if rule in ("union", "all_of") or not configured(t, default, name):
                continue  # both sides apply, or the team left it at its default
            binds_with = meta.get("binds_with")
            if binds_with and not (getattr(p, binds_with) and getattr(t, binds_with)):
                continue  # one side imposes nothing here (see _merge_section)
            merged = _merge_value(rule, pv, tv)
            if spec_to_dict(merged) != spec_to_dict(tv):
                flag(sub, rule, tv, merged)

    visit(platform, team, "")
    return found
