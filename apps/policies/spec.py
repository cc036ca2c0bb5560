"""The policy spec: a typed, validated schema for what a `PolicyVersion.spec` JSON may say.

Pure Python (no ORM): the validator, the overlay ("tighten, never loosen") and the help text all
read one declaration — the dataclasses below and their field metadata — so the editor, the
validator and the merge can never disagree.

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

# `_f(...)` returns `dataclasses.field(...)` (with help text and merge rule); ruff cannot see that.
# ruff: noqa: RUF009
from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, Literal, get_args, get_origin, get_type_hints

ConstraintAction = Literal["repair", "block"]
# A plan that crosses a plan-check limit: wait for an approver, or end blocked at once.
HoldAction = Literal["require_approval", "block"]
BoundaryLabel = Literal["pii", "secrets"]
GuardAction = Literal["block", "redact", "warn", "require_review"]
OnCheckError = Literal["fail_closed", "fail_open"]
TermKind = Literal["keyword", "regex"]

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
}

# Size bounds on what a policy may store (refused at save/publish with the field path).
MAX_PATTERN_CHARS = 500  # a keyword or a regular expression
MAX_TEXT_CHARS = 300  # names, messages, keys, tags: any text field without its own bound
MAX_PROMPT_CHARS = 4000  # a model judge's rule prompt
MAX_SCHEMA_CHARS = 64 * 1024  # the output JSON schema, serialised
MAX_LIST_ITEMS = 200


def _f(default: Any, help: str, merge: str, **extra: Any) -> Any:
    """A dataclass field carrying its help text and merge rule (see the module docstring)."""
    meta = {"help": help, "merge": merge, **extra}
    if isinstance(default, list | dict | tuple) or dataclasses.is_dataclass(default):
        value = default
        return field(default_factory=lambda: value, metadata=meta)
    return field(default=default, metadata=meta)


# ------------------------------------------------------------------------------------ constraints


@dataclass(frozen=True)
class StepsLimit:
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


@dataclass(frozen=True)
class DepthLimit:
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


@dataclass(frozen=True)
class ParallelLimit:
    value: int | None = _f(
        4, "Most steps running at the same time. Empty: no policy limit.", "min", minimum=1, maximum=64
    )
    action: ConstraintAction = _f(
        "repair",
        "repair: run the plan but at most this many steps at once; block: reject wider plans.",
        "stricter",
    )


@dataclass(frozen=True)
class WorkerRule:
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


@dataclass(frozen=True)
class ConfidentialRule:
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


@dataclass(frozen=True)
class Caps:
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


@dataclass(frozen=True)
class ForecastRule:
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


@dataclass(frozen=True)
class DataBoundary:
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


@dataclass(frozen=True)
class ApprovalRule:
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


@dataclass(frozen=True)
class VerificationRuleSpec:
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


@dataclass(frozen=True)
class Verification:
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


@dataclass(frozen=True)
class Constraints:
    max_steps: StepsLimit = _f(StepsLimit(), "Plan size limit.", "nested")
    max_depth: DepthLimit = _f(DepthLimit(), "Recursion (re-planning) limit.", "nested")
    max_parallel: ParallelLimit = _f(ParallelLimit(), "Concurrency limit.", "nested")
    workers: WorkerRule = _f(WorkerRule(), "Which workers steps may use.", "nested")
    confidential: ConfidentialRule = _f(
        ConfidentialRule(), "Confidential data stays on local workers.", "nested"
    )
    caps: Caps = _f(Caps(), "Per-run caps, checked before every step.", "nested")
    forecast: ForecastRule = _f(ForecastRule(), "Plan checks: forecast before execution.", "nested")
    data_boundary: DataBoundary = _f(
        DataBoundary(), "Plan checks: labelled data stays inside the team's data boundary.", "nested"
    )
    approval: ApprovalRule = _f(ApprovalRule(), "Plans held for an approver.", "nested")
    verification: Verification = _f(Verification(), "Required verification steps.", "nested")


# ------------------------------------------------------------------------------------ budgets


@dataclass(frozen=True)
class BudgetLimit:
    soft_usd: Decimal | None = _f(
        None, "Spend (USD) after which runs are flagged with a warning.", "min", minimum=0
    )
    hard_usd: Decimal | None = _f(
        None, "Spend (USD) after which new runs are refused until the reset.", "min", minimum=0
    )


@dataclass(frozen=True)
class Budgets:
    daily: BudgetLimit = _f(BudgetLimit(), "Per UTC day; resets at 00:00 UTC.", "nested")
    monthly: BudgetLimit = _f(
        BudgetLimit(), "Per UTC calendar month; resets at 00:00 UTC on the 1st.", "nested"
    )


# ------------------------------------------------------------------------------------ learning


@dataclass(frozen=True)
class Learning:
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


@dataclass(frozen=True)
class PiiCheck:
    enabled: bool = _f(False, "Detect personal data.", "or")
    action: GuardAction = _f("redact", _ACTION_HELP, "stricter")
    types: tuple[str, ...] = _f(
        PII_TYPES, "Which kinds: " + ", ".join(PII_TYPES) + ".", "union", choices=PII_TYPES
    )


@dataclass(frozen=True)
class SecretsCheck:
    enabled: bool = _f(False, "Detect API keys, private keys and tokens.", "or")
    action: GuardAction = _f("block", _ACTION_HELP, "stricter")
    types: tuple[str, ...] = _f(
        SECRET_TYPES, "Which kinds: " + ", ".join(SECRET_TYPES) + ".", "union", choices=SECRET_TYPES
    )


@dataclass(frozen=True)
class InjectionCheck:
    enabled: bool = _f(False, "Heuristics for prompt injection and jailbreak attempts.", "or")
    action: GuardAction = _f("block", _ACTION_HELP + " (redact removes the matching phrase)", "stricter")
    extra_patterns: tuple[str, ...] = _f(
        (), "Extra regular expressions (case-insensitive) that count as injection.", "union", regex=True
    )


@dataclass(frozen=True)
class TermRule:
    pattern: str = _f(
        "",
        "A keyword (whole word, case-insensitive) or a regular expression.",
        "union",
        required=True,
        max_chars=MAX_PATTERN_CHARS,
    )
    kind: TermKind = _f("keyword", "keyword or regex.", "union")
    message: str = _f("", "What the user is told when this term is found (default: 'blocked term').", "union")


@dataclass(frozen=True)
class BlockedTermsCheck:
    enabled: bool = _f(False, "Block topics or terms.", "or")
    action: GuardAction = _f("block", _ACTION_HELP, "stricter")
    terms: tuple[TermRule, ...] = _f((), "The terms; each with its own message.", "union")


@dataclass(frozen=True)
class LengthCheck:
    enabled: bool = _f(False, "Limit the text length.", "or")
    action: GuardAction = _f(
        "block", "block, warn or require_review (redact truncates to the limit).", "stricter"
    )
    max_chars: int | None = _f(None, "Most characters allowed.", "min", minimum=1)


@dataclass(frozen=True)
class JsonSchemaCheck:
    enabled: bool = _f(False, "The final answer must be JSON matching the schema (output stage only).", "or")
    action: GuardAction = _f("block", "block, warn or require_review.", "stricter", exclude=("redact",))
    schema: dict[str, Any] | None = _f(None, "A JSON Schema (draft 2020-12) object.", "all_of")


@dataclass(frozen=True)
class Judge:
    name: str = _f("", "A short name, e.g. 'no financial advice'.", "union", required=True)
    worker: str = _f("", "Key of the pool worker that judges.", "union", required=True)
    prompt: str = _f(
        "",
        "The rule the judge applies, e.g. 'The answer gives no personal financial advice.'",
        "union",
        required=True,
        max_chars=MAX_PROMPT_CHARS,
    )


@dataclass(frozen=True)
class ModelJudgeCheck:
    enabled: bool = _f(
        False, "A chosen worker judges the text against policy prompts (pass/fail + reason).", "or"
    )
    action: GuardAction = _f("block", "block, warn or require_review.", "stricter", exclude=("redact",))
    judges: tuple[Judge, ...] = _f((), "The judges to run.", "union")


@dataclass(frozen=True)
class StageGuardrails:
    pii: PiiCheck = _f(
        PiiCheck(),
        "Personal data: e-mail, phone, payment card (Luhn), IBAN (mod 97), national IDs, IP addresses.",
        "nested",
    )
    secrets: SecretsCheck = _f(
        SecretsCheck(), "Secrets: sk-…, AKIA…, ghp_…, xox…, private key blocks, JWTs.", "nested"
    )
    injection: InjectionCheck = _f(InjectionCheck(), "Prompt injection / jailbreak heuristics.", "nested")
    blocked_terms: BlockedTermsCheck = _f(BlockedTermsCheck(), "Blocked topics and terms.", "nested")
    length: LengthCheck = _f(LengthCheck(), "Length limit.", "nested")
    json_schema: JsonSchemaCheck = _f(
        JsonSchemaCheck(), "JSON schema (output only).", "nested", stages=("output",)
    )
    model_judge: ModelJudgeCheck = _f(
        ModelJudgeCheck(), "Model-judged checks.", "nested", stages=("step_output", "output")
    )


@dataclass(frozen=True)
class Guardrails:
    on_check_error: OnCheckError = _f(
        "fail_closed",
        "When a check itself breaks: fail_closed blocks (default); fail_open lets the text through, recorded as bypassed.",
        "stricter",
    )
    input: StageGuardrails = _f(
        StageGuardrails(), "Checks on the request before any worker sees it.", "nested"
    )
    step_output: StageGuardrails = _f(
        StageGuardrails(), "Checks on each worker's output before later steps read it.", "nested"
    )
    output: StageGuardrails = _f(StageGuardrails(), "Checks on the final answer.", "nested")


@dataclass(frozen=True)
class PolicySpec:
    constraints: Constraints = _f(
        Constraints(), "Workflow constraints, checked at plan time and before every step.", "nested"
    )
    budgets: Budgets = _f(Budgets(), "Team spend limits.", "nested")
    learning: Learning = _f(Learning(), "The learned router: exploration, reward and metric.", "nested")
    guardrails: Guardrails = _f(Guardrails(), "Guardrails per stage.", "nested")


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


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = get_type_hints(cls)
    return _HINTS[cls]


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _type_name(value: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "true/false", type(None): "null"}.get(
        type(value), type(value).__name__
    )


def _parse_value(tp: Any, value: Any, path: str, meta: Mapping[str, Any], errors: list[FieldError]) -> Any:
    origin = get_origin(tp)
    args = get_args(tp)
    if origin in (typing.Union, types.UnionType):
        non_none = [a for a in args if a is not type(None)]
        if value is None:
            return None
        return _parse_value(non_none[0], value, path, meta, errors)
    if dataclasses.is_dataclass(tp):
        return _parse_dataclass(tp, value, path, errors)  # type: ignore[arg-type]
    if origin is Literal:
        if value not in args:
            errors.append(
                FieldError(path, f"must be one of {', '.join(map(str, args))}; got {value!r}"[:300])
            )
            return None
        excluded = meta.get("exclude", ())
        if value in excluded:
            allowed = [a for a in args if a not in excluded]
            errors.append(
                FieldError(path, f"{value!r} is not available for this check; choose {', '.join(allowed)}")
            )
            return None
        return value
    if tp is bool:
        if not isinstance(value, bool):
            errors.append(FieldError(path, f"must be true or false, got {_type_name(value)}"))
            return None
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            errors.append(FieldError(path, f"must be a whole number, got {value!r}"[:200]))
            return None
        return _bounds(value, path, meta, errors)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            errors.append(FieldError(path, f"must be a number, got {value!r}"[:200]))
            return None
        return _bounds(float(value), path, meta, errors)
    if tp is Decimal:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            errors.append(
                FieldError(path, f'must be an amount in USD, e.g. 5 or "2.50"; got {value!r}'[:200])
            )
            return None
        try:
            dec = Decimal(str(value))
        except InvalidOperation:
            errors.append(
                FieldError(path, f'must be an amount in USD, e.g. 5 or "2.50"; got {value!r}'[:200])
            )
            return None
        if not dec.is_finite():
            errors.append(FieldError(path, "must be a finite amount"))
            return None
        return _bounds(dec, path, meta, errors)
    if tp is str:
        if not isinstance(value, str):
            errors.append(FieldError(path, f"must be a string, got {_type_name(value)}"))
            return None
        limit = meta.get("max_chars") or (MAX_PATTERN_CHARS if meta.get("regex") else MAX_TEXT_CHARS)
        if len(value) > limit:
            errors.append(FieldError(path, f"is {len(value)} characters long; at most {limit} are allowed"))
            return None
        if _bad_chars(value):
            errors.append(FieldError(path, "must not contain NUL characters or unpaired surrogates"))
            return None
        if meta.get("required") and not value.strip():
            errors.append(FieldError(path, "must not be empty"))
            return None
        if meta.get("regex"):
            _check_regex(value, path, errors)
        return value
    if origin is tuple:
        item_tp = args[0]
        if not isinstance(value, list | tuple):
            errors.append(FieldError(path, f"must be a list, got {_type_name(value)}"))
            return None
        if len(value) > MAX_LIST_ITEMS:
            errors.append(FieldError(path, f"has {len(value)} entries; at most {MAX_LIST_ITEMS} are allowed"))
            return None
        out = []
        choices = meta.get("choices")
        item_meta = {k: v for k, v in meta.items() if k in ("regex",)}
        for i, item in enumerate(value):
            p = _join(path, i)
            if item_tp is str and isinstance(item, str) and not item.strip():
                errors.append(FieldError(p, "must not be empty"))
                continue
            parsed = _parse_value(item_tp, item, p, item_meta, errors)
            if parsed is None:
                continue
            if choices is not None and parsed not in choices:
                errors.append(
                    FieldError(p, f"unknown value {parsed!r}; choose from {', '.join(choices)}"[:300])
                )
                continue
            if parsed not in out:
                out.append(parsed)
        return tuple(out)
    if origin is dict:
        if not isinstance(value, dict):
            errors.append(FieldError(path, f"must be an object, got {_type_name(value)}"))
            return None
        if path.endswith("json_schema.schema"):
            _check_json_schema(value, path, errors)
        return value
    raise TypeError(f"unsupported spec type {tp!r} at {path}")  # a bug in this module, not user input


def _bounds(value: Any, path: str, meta: Mapping[str, Any], errors: list[FieldError]) -> Any:
    lo, hi = meta.get("minimum"), meta.get("maximum")
    if lo is not None and value < lo:
        errors.append(FieldError(path, f"must be at least {lo}, got {value}"))
        return None
    if hi is not None and value > hi:
        errors.append(FieldError(path, f"must be at most {hi}, got {value}"))
        return None
    return value


_BAD_CHARS = re.compile("[\x00\ud800-\udfff]")


def _bad_chars(text: str) -> bool:
    """NUL (PostgreSQL text cannot hold it) or a lone surrogate (not encodable as UTF-8)."""
    return _BAD_CHARS.search(text) is not None


def _check_regex(pattern: str, path: str, errors: list[FieldError]) -> None:
    if len(pattern) > MAX_PATTERN_CHARS:
        errors.append(FieldError(path, f"the pattern is longer than {MAX_PATTERN_CHARS} characters"))
        return
    # Policy patterns run on RE2 (linear time); what RE2 refuses cannot be published.
    from apps.policies.guardrails.regex import regex_problem  # the guardrails package imports this module

    problem = regex_problem(pattern)
    if problem is not None:
        errors.append(
            FieldError(path, f"invalid regular expression for RE2 (linear-time matching): {problem}"[:300])
        )


def _check_json_schema(schema: dict[str, Any], path: str, errors: list[FieldError]) -> None:
    import json

    import jsonschema

    try:
        size = len(json.dumps(schema))
    except (TypeError, ValueError, RecursionError):
        errors.append(FieldError(path, "must be a JSON object"))
        return
    if size > MAX_SCHEMA_CHARS:
        errors.append(
            FieldError(path, f"is {size} characters as JSON; at most {MAX_SCHEMA_CHARS} are allowed")
        )
        return
    stack: list[Any] = [schema]
    while stack:  # iterative: the loaders bound the depth, this must not recurse on it either
        node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, value in items:
            if (isinstance(key, str) and _bad_chars(key)) or (isinstance(value, str) and _bad_chars(value)):
                errors.append(FieldError(path, "must not contain NUL characters or unpaired surrogates"))
                return
            if isinstance(value, dict | list):
                stack.append(value)

    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as err:
        where = "/".join(str(p) for p in err.path)
        errors.append(
            FieldError(path, f"invalid JSON schema{(' at ' + where) if where else ''}: {err.message}"[:300])
        )


def _parse_dataclass(cls: type, data: Any, path: str, errors: list[FieldError]) -> Any:
    if not isinstance(data, Mapping):
        errors.append(FieldError(path, f"must be an object, got {_type_name(data)}"))
        return None
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = _hints(cls)
    for key in data:
        if key not in fields:
            known = ", ".join(fields)
            errors.append(FieldError(_join(path, str(key)[:100]), f"unknown field (known: {known})"))
    kwargs: dict[str, Any] = {}
    stage = path.rsplit(".", 1)[-1] if path.startswith("guardrails.") else None
    for name, f in fields.items():
        if name not in data:
            if f.metadata.get("required"):
                errors.append(FieldError(_join(path, name), "is required"))
            continue
        before = len(errors)
        value = _parse_value(hints[name], data[name], _join(path, name), f.metadata, errors)
        stages = f.metadata.get("stages")
        if stages and stage is not None and stage not in stages and getattr(value, "enabled", False):
            # Serialised specs carry every check in every stage; only enabling one is an error.
            errors.append(
                FieldError(
                    _join(path, name), f"this check is only available in the {' and '.join(stages)} stage(s)"
                )
            )
        if len(errors) == before:
            kwargs[name] = value
    try:
        obj = cls(**kwargs)
    except TypeError:  # pragma: no cover — every field has a default
        return None
    return _cross_checks(obj, path, errors)


def _add_once(errors: list[FieldError], error: FieldError) -> None:
    if not any(e.path == error.path for e in errors):
        errors.append(error)


def _cross_checks(obj: Any, path: str, errors: list[FieldError]) -> Any:
    """Rules that span several fields of one object (skipped where a field already failed)."""
    if (
        isinstance(obj, BudgetLimit)
        and obj.soft_usd is not None
        and obj.hard_usd is not None
        and obj.soft_usd > obj.hard_usd
    ):
        _add_once(
            errors,
            FieldError(
                _join(path, "soft_usd"),
                f"the soft limit ({obj.soft_usd}) is above the hard limit ({obj.hard_usd})",
            ),
        )
    if isinstance(obj, LengthCheck) and obj.enabled and obj.max_chars is None:
        _add_once(
            errors, FieldError(_join(path, "max_chars"), "is required when the length check is enabled")
        )
    if isinstance(obj, JsonSchemaCheck) and obj.enabled and obj.schema is None:
        _add_once(
            errors, FieldError(_join(path, "schema"), "is required when the JSON schema check is enabled")
        )
    if isinstance(obj, ModelJudgeCheck) and obj.enabled and not obj.judges:
        _add_once(
            errors, FieldError(_join(path, "judges"), "add at least one judge when the check is enabled")
        )
    if isinstance(obj, BlockedTermsCheck) and obj.enabled and not obj.terms:
        _add_once(errors, FieldError(_join(path, "terms"), "add at least one term when the check is enabled"))
    if (
        isinstance(obj, TermRule)
        and obj.kind == "regex"
        and not any(e.path == _join(path, "pattern") for e in errors)
    ):
        _check_regex(obj.pattern, _join(path, "pattern"), errors)
    if isinstance(obj, WorkerRule):
        allowed = set(obj.allowed_workers or ())
        both = sorted(allowed & set(obj.denied_workers))
        if both:
            _add_once(
                errors,
                FieldError(_join(path, "denied_workers"), f"{', '.join(both)} is both allowed and denied"),
            )
    return obj


def validate_spec(data: Any) -> tuple[PolicySpec | None, list[FieldError]]:
    """Validate raw JSON data; return (spec, []) or (None, every error with its field path)."""
    errors: list[FieldError] = []
    spec = _parse_dataclass(PolicySpec, data, "", errors)
    if errors:
        return None, errors
    return spec, []


def parse_spec(data: Any) -> PolicySpec:
    """Like `validate_spec` but raises `SpecError` listing every error."""
    spec, errors = validate_spec(data)
    if errors or spec is None:
        raise SpecError(errors)
    return spec


# ------------------------------------------------------------------------------------ serialisation


def spec_to_dict(obj: Any) -> Any:
    """JSON-safe dict of a spec (Decimals as strings, tuples as lists)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: spec_to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple | list):
        return [spec_to_dict(v) for v in obj]
    if isinstance(obj, Decimal):
        return str(obj)
    return obj


def default_spec() -> PolicySpec:
    return PolicySpec()


# ------------------------------------------------------------------------------------ overlay


def _merge_value(rule: str, platform: Any, team: Any, tp: Any) -> Any:
    if rule == "nested":
        return _merge_dataclass(platform, team)
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


def _merge_dataclass(platform: Any, team: Any) -> Any:
    # A disabled check imposes nothing: merging its default action ("block") with an enabled
    # team check would silently turn the team's warn/require_review into a block.
    if "enabled" in {f.name for f in dataclasses.fields(platform)}:
        if not platform.enabled:
            return team
        if not team.enabled:
            return platform
    kwargs = {}
    hints = _hints(type(platform))
    for f in dataclasses.fields(platform):
        p, t = getattr(platform, f.name), getattr(team, f.name)
        binds_with = f.metadata.get("binds_with")
        # A side without the sibling entries (e.g. no verification rules) imposes nothing here.
        if binds_with and not getattr(platform, binds_with):
            kwargs[f.name] = t
        elif binds_with and not getattr(team, binds_with):
            kwargs[f.name] = p
        else:
            kwargs[f.name] = _merge_value(f.metadata["merge"], p, t, hints[f.name])
    return type(platform)(**kwargs)


def merge_specs(platform: PolicySpec, team: PolicySpec | None) -> PolicySpec:
    """Overlay the team's spec on the platform default: tighten, never loosen (see module doc)."""
    if team is None:
        return platform
    return _merge_dataclass(platform, team)


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
    if dataclasses.is_dataclass(tp):
        return "object"
    return {bool: "true/false", int: "whole number", float: "number", Decimal: "USD amount", str: "text"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def iter_field_help(cls: type = PolicySpec, prefix: str = "") -> Iterator[FieldHelp]:
    """Every field of the spec with its help text and merge rule, in declaration order."""
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        path = _join(prefix, f.name)
        tp = hints[f.name]
        merge = f.metadata["merge"]
        if merge == "nested":
            yield FieldHelp(path, f.metadata["help"], merge, "", "section", None)
            yield from iter_field_help(tp, path)
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc,operator]
        yield FieldHelp(
            path, f.metadata["help"], merge, MERGE_RULE_TEXT[merge], _type_text(tp), spec_to_dict(default)
        )
        item = get_args(tp)[0] if get_origin(tp) is tuple else None
        if isinstance(item, type) and dataclasses.is_dataclass(item):
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
        from apps.engine.types import Limits

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
        return dataclasses.replace(base, **kwargs)
