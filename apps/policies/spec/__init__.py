"""The policy spec: a typed, validated schema for what a `PolicyVersion.spec` JSON may say.

Pure Python (no ORM): the validator, the overlay ("tighten, never loosen"), the help text and the
structured editor all read one declaration — the pydantic models of this package (`fields`, `constraints`, `guardrails`, `policy`), their field descriptions
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

from apps.policies.spec.constraints import (
    ApprovalRule,
    BudgetLimit,
    Budgets,
    Caps,
    ConfidentialRule,
    Constraints,
    DataBoundary,
    DepthLimit,
    ForecastRule,
    Learning,
    ParallelLimit,
    StepsLimit,
    Verification,
    VerificationRuleSpec,
    WorkerRule,
)
from apps.policies.spec.effective import PLAN_ENVELOPE_STEPS, EffectivePolicy, inert_fields
from apps.policies.spec.fields import (
    MAX_LIST_ITEMS,
    MAX_PATTERN_CHARS,
    MAX_PROMPT_CHARS,
    MAX_SCHEMA_CHARS,
    MAX_TEXT_CHARS,
    PII_TYPES,
    SECRET_TYPES,
    STAGES,
    STRICTNESS,
    BoundaryLabel,
    ConstraintAction,
    FieldError,
    GuardAction,
    HoldAction,
    OnCheckError,
    PartialAnswers,
    Problems,
    SpecError,
    SpecField,
    TermKind,
    ToolAction,
    _f,
    _hints,
    _join,
    _Spec,
    field_meta,
    is_section,
    spec_fields,
)
from apps.policies.spec.guardrails import (
    BlockedTermsCheck,
    Guardrails,
    InjectionCheck,
    JsonSchemaCheck,
    Judge,
    LengthCheck,
    ModelJudgeCheck,
    PiiCheck,
    SecretsCheck,
    StageGuardrails,
    TermRule,
    ToolOutputChecks,
    ToolOutputInjection,
    ToolRule,
    ToolsPolicy,
)
from apps.policies.spec.help import MERGE_RULE_TEXT, FieldHelp, field_help_map, iter_field_help
from apps.policies.spec.overlay import diff_dicts, merge_specs, walk
from apps.policies.spec.policy import (
    PolicySpec,
    default_spec,
    parse_spec,
    policy_json_schema,
    spec_to_dict,
    validate_spec,
)
from apps.policies.spec.shadowed import shadowed_fields

__all__ = [
    "MAX_LIST_ITEMS",
    "MAX_PATTERN_CHARS",
    "MAX_PROMPT_CHARS",
    "MAX_SCHEMA_CHARS",
    "MAX_TEXT_CHARS",
    "MERGE_RULE_TEXT",
    "PII_TYPES",
    "PLAN_ENVELOPE_STEPS",
    "SECRET_TYPES",
    "STAGES",
    "STRICTNESS",
    "ApprovalRule",
    "BlockedTermsCheck",
    "BoundaryLabel",
    "BudgetLimit",
    "Budgets",
    "Caps",
    "ConfidentialRule",
    "ConstraintAction",
    "Constraints",
    "DataBoundary",
    "DepthLimit",
    "EffectivePolicy",
    "FieldError",
    "FieldHelp",
    "ForecastRule",
    "GuardAction",
    "Guardrails",
    "HoldAction",
    "InjectionCheck",
    "JsonSchemaCheck",
    "Judge",
    "Learning",
    "LengthCheck",
    "ModelJudgeCheck",
    "OnCheckError",
    "ParallelLimit",
    "PartialAnswers",
    "PiiCheck",
    "PolicySpec",
    "Problems",
    "SecretsCheck",
    "SpecError",
    "SpecField",
    "StageGuardrails",
    "StepsLimit",
    "TermKind",
    "TermRule",
    "ToolAction",
    "ToolOutputChecks",
    "ToolOutputInjection",
    "ToolRule",
    "ToolsPolicy",
    "Verification",
    "VerificationRuleSpec",
    "WorkerRule",
    "_Spec",
    "_f",
    "_hints",
    "_join",
    "default_spec",
    "diff_dicts",
    "field_help_map",
    "field_meta",
    "inert_fields",
    "is_section",
    "iter_field_help",
    "merge_specs",
    "parse_spec",
    "policy_json_schema",
    "shadowed_fields",
    "spec_fields",
    "spec_to_dict",
    "validate_spec",
    "walk",
]
