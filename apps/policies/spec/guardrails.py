"""The spec's guardrail sections (per stage: PII, secrets, injection, blocked terms, length, JSON
schema, model judges) and the governed tools section."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from apps.policies.spec.fields import (
    MAX_PATTERN_CHARS,
    MAX_PROMPT_CHARS,
    PII_TYPES,
    SECRET_TYPES,
    STAGES,
    GuardAction,
    OnCheckError,
    Problems,
    TermKind,
    ToolAction,
    _f,
    _meta,
    _regex_problem,
    _Spec,
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

    def _problems(self) -> Problems:
        if self.kind == "regex":
            problem = _regex_problem(self.pattern)
            if problem:
                return [("pattern", problem)]
        return []


class BlockedTermsCheck(_Spec):
    enabled: bool = _f(False, "Block topics or terms.", "or")
    action: GuardAction = _f("block", _ACTION_HELP, "stricter")
    terms: tuple[TermRule, ...] = _f((), "The terms; each with its own message.", "union")

    def _problems(self) -> Problems:
        if self.enabled and not self.terms:
            return [("terms", "add at least one term when the check is enabled")]
        return []


class LengthCheck(_Spec):
    enabled: bool = _f(False, "Limit the text length.", "or")
    action: GuardAction = _f(
        "block", "block, warn or require_review (redact truncates to the limit).", "stricter"
    )
    max_chars: int | None = _f(None, "Most characters allowed.", "min", minimum=1)

    def _problems(self) -> Problems:
        if self.enabled and self.max_chars is None:
            return [("max_chars", "is required when the length check is enabled")]
        return []


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

        def _problems(self) -> Problems:
            if self.enabled and self.schema is None:
                return [("schema", "is required when the JSON schema check is enabled")]
            return []


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

    def _problems(self) -> Problems:
        if self.enabled and not self.judges:
            return [("judges", "add at least one judge when the check is enabled")]
        return []


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

    def _problems(self) -> Problems:
        return _stage_problems(self.model_dump())


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

    def _problems(self) -> Problems:
        problems: Problems = []
        if "." not in self.tool.strip("."):
            problems.append(("tool", "name the tool as <server slug>.<tool name>"))
        if bool(self.argument) != bool(self.pattern):
            problems.append(("pattern", "give both an argument and its pattern, or neither"))
        elif self.pattern:
            problem = _regex_problem(self.pattern)
            if problem:
                problems.append(("pattern", problem))
        return problems


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
