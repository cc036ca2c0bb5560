"""Forms for providers, workers and pools. Shape checks here; meaning checks in the services,
whose ``ValidationError``s land on the same fields (``apply_service_errors``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from django import forms

from apps.governance.forms import apply_service_errors  # noqa: F401  (re-exported for the views)
from apps.workers.models import ProviderKind
from apps.workers.services import KEY_ENV_RULE, KIND_FIELDS

if TYPE_CHECKING:
    from apps.governance.models import Team
    from apps.workers.models import Provider, Worker

SLUG_ERRORS = {"required": "Enter a slug.", "invalid": "Use lowercase letters, digits and hyphens only."}


# Per kind: the Base URL's help (the field means something different for each).
BASE_URL_HELP = {
    ProviderKind.OPENAI: "Optional: empty means api.openai.com; set it for a gateway in front of OpenAI.",
    ProviderKind.ANTHROPIC: "Optional: empty means api.anthropic.com; set it for a gateway in front of Anthropic.",
    ProviderKind.OPENAI_COMPATIBLE: (
        "Required: the endpoint's /v1 URL, e.g. http://127.0.0.1:11434/v1 (Ollama) or "
        "https://llm.example.com/v1 (vLLM). Private and loopback addresses need an EGRESS_ALLOW "
        "entry on the server."
    ),
}
TEST_MODEL_HELP = {
    ProviderKind.OPENAI: "Empty: gpt-4o-mini.",
    ProviderKind.ANTHROPIC: "Empty: claude-3-5-haiku-latest.",
    ProviderKind.OPENAI_COMPATIBLE: "Required here: a model the endpoint serves, e.g. llama3.1:8b.",
    ProviderKind.LOCAL: "Not needed: the model file above is loaded.",
}
API_KEY_HELP = {
    ProviderKind.OPENAI: "Required to call OpenAI (sk-…). ",
    ProviderKind.ANTHROPIC: "Required to call Anthropic (sk-ant-…). ",
    ProviderKind.OPENAI_COMPATIBLE: "Optional: servers such as Ollama or vLLM often need none. ",
}
KEY_HELP_NEW = "Write-only: it is encrypted at rest and never shown again."
KEY_HELP_TAIL = (
    KEY_HELP_NEW + " Leave empty to keep the current key; "
    "changing the kind, base URL or key variable forgets it unless you enter it again."
)


class ProviderForm(forms.Form):
    """One form for every kind; only the fields the chosen kind uses are shown (``kind_fields``)
    and cleaned (another kind's values are dropped, so a hidden field never saves a value)."""

    team: forms.ModelChoiceField[Team] = forms.ModelChoiceField(
        queryset=None,
        required=False,
        empty_label="— platform (all teams, superusers only) —",
        help_text="The team that owns this provider and its credentials.",
        error_messages={"invalid_choice": "Choose one of your teams."},
    )
    slug = forms.SlugField(
        max_length=50, error_messages=SLUG_ERRORS, help_text="Unique id, e.g. openai-prod."
    )
    name = forms.CharField(max_length=100, error_messages={"required": "Give the provider a name."})
    kind = forms.ChoiceField(
        choices=ProviderKind.choices,
        label="Kind",
        help_text="Which API the provider speaks; the fields below follow it.",
        error_messages={"invalid_choice": "Choose a provider kind from the list."},
    )
    # A CharField: the service's egress check (apps.engine.egress) gives the precise refusal
    # (which address, which rule) where URLField would only say "invalid".
    base_url = forms.CharField(required=False, max_length=300, label="Base URL")
    model_path = forms.CharField(
        required=False,
        max_length=500,
        label="Model file (.gguf)",
        help_text="A .gguf path on the server; empty means the bundled SmolLM2.",
    )
    api_key_env = forms.CharField(
        required=False,
        max_length=100,
        label="API key environment variable",
        help_text=(
            "Platform administrators only: the name of a server environment variable holding the key, "
            "allowed by PROVIDER_KEY_ENV_PREFIX (e.g. CONDUCTOR_PROVIDER_KEY_OPENAI) or "
            "PROVIDER_KEY_ENV_ALLOWED."
        ),
    )
    api_key = forms.CharField(
        required=False,
        max_length=500,
        label="API key (stored encrypted)",
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text=KEY_HELP_TAIL,
    )
    clear_api_key = forms.BooleanField(required=False, label="Forget the stored key")
    # Not saved: only "Test connection" reads it.
    test_model = forms.CharField(
        required=False,
        max_length=200,
        label="Model to test with",
        help_text="Only for “Test connection” (not saved).",
    )

    # Fields shown whatever the kind; the others follow ``KIND_FIELDS``.
    COMMON = ("team", "slug", "name", "kind")

    def __init__(
        self,
        *args: Any,
        teams: Any = None,
        editing: bool = False,
        current_kind: str | None = None,
        can_set_key_env: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.current_kind = current_kind
        self.key_tail = KEY_HELP_TAIL if editing else KEY_HELP_NEW  # a new provider has no key to keep
        self.key_env_refused = not can_set_key_env
        if not can_set_key_env:
            # Only platform administrators may name a server variable (issue 13): not offered.
            del self.fields["api_key_env"]
        if editing:
            for name in ("team", "slug"):
                del self.fields[name]
            # Optional when editing: absent means unchanged (older clients post no kind).
            self.fields["kind"].required = False
        else:
            del self.fields["clear_api_key"]
            cast("forms.ModelChoiceField[Team]", self.fields["team"]).queryset = teams
        kind = self.selected_kind()
        self.fields["base_url"].help_text = BASE_URL_HELP.get(kind, "")
        self.fields["api_key"].help_text = API_KEY_HELP.get(kind, "") + self.key_tail
        for name, field in self.fields.items():
            kinds = self.kinds_of(name)
            if kinds is not None:
                field.widget.attrs["data-kinds"] = " ".join(kinds)

    @staticmethod
    def kinds_of(name: str) -> tuple[str, ...] | None:
        """The kinds that use field ``name`` (None: every kind)."""
        if name in ProviderForm.COMMON:
            return None
        if name == "clear_api_key":
            name = "api_key"
        if name == "test_model":
            return tuple(ProviderKind.values)
        return tuple(k for k, fields in KIND_FIELDS.items() if name in fields)

    def selected_kind(self) -> str:
        """The kind the form is about: posted, else the initial/stored one, else OpenAI."""
        raw = self.data.get("kind") if self.is_bound else None
        if raw in ProviderKind.values:
            return str(raw)
        initial = self.initial.get("kind") or self.current_kind
        return str(initial) if initial in ProviderKind.values else ProviderKind.OPENAI

    def shown(self, name: str) -> bool:
        kinds = self.kinds_of(name)
        return kinds is None or self.selected_kind() in kinds

    def rows(self) -> list[dict[str, Any]]:
        """The page's fields with the kinds each serves (the script toggles them; without it the
        server shows the chosen kind's). ``test_model`` sits with the test button instead."""
        return [
            {
                "field": self[name],
                "kinds": " ".join(self.kinds_of(name) or ()),
                "shown": self.shown(name),
                "helps": self._kind_helps(name),
            }
            for name in self.fields
            if name != "test_model"
        ]

    def _kind_helps(self, name: str) -> list[dict[str, Any]]:
        """Per-kind help of ``name`` (the script shows the chosen kind's), or [] for one text."""
        table = {"base_url": BASE_URL_HELP, "api_key": API_KEY_HELP, "test_model": TEST_MODEL_HELP}.get(name)
        if table is None:
            return []
        tail = self.key_tail if name == "api_key" else ""
        head = "Only for “Test connection” (not saved). " if name == "test_model" else ""
        kind = self.selected_kind()
        return [{"kind": k, "text": head + text + tail, "shown": k == kind} for k, text in table.items()]

    def test_model_helps(self) -> list[dict[str, Any]]:
        return self._kind_helps("test_model")

    def clean_base_url(self) -> str:
        value: str = self.cleaned_data.get("base_url") or ""
        if value and "://" not in value:
            value = f"https://{value}"  # what URLField's assume_scheme did
        return value

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.key_env_refused and str(self.data.get("api_key_env") or "").strip():
            # Not offered, yet posted (a crafted request): refused by its rule, not silently dropped.
            self.add_error(None, KEY_ENV_RULE)
        kind = data.get("kind") or self.current_kind or ProviderKind.OPENAI
        used = KIND_FIELDS.get(kind, ())
        for name in ("base_url", "model_path", "api_key_env", "api_key"):
            if name in data and name not in used:
                # Another kind's field (hidden on the page): never saved, never validated.
                data[name] = ""
        return data

    def service_kwargs(self) -> dict[str, Any]:
        data = dict(self.cleaned_data)
        data.pop("test_model", None)
        return data


class WorkerForm(forms.Form):
    provider: forms.ModelChoiceField[Provider] = forms.ModelChoiceField(
        queryset=None,
        error_messages={"required": "Choose a provider.", "invalid_choice": "Choose one of your providers."},
    )
    slug = forms.SlugField(
        max_length=60, error_messages=SLUG_ERRORS, help_text="Unique id; the conductor sees it."
    )
    display_name = forms.CharField(
        max_length=100, error_messages={"required": "Give the worker a display name."}
    )
    model_name = forms.CharField(
        max_length=200,
        help_text="The provider's model id, e.g. gpt-5.",
        error_messages={"required": "Enter the provider's model name (e.g. gpt-5)."},
    )
    strengths = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="What it is good at; the conductor reads this.",
    )
    tags = forms.CharField(required=False, max_length=200, help_text="Comma-separated, e.g. local, external.")
    cost_rank = forms.IntegerField(
        min_value=1,
        max_value=5,
        initial=1,
        help_text="1 (cheapest) to 5.",
        error_messages={
            "min_value": "Cost rank is 1 to 5.",
            "max_value": "Cost rank is 1 to 5.",
            "required": "Enter a cost rank from 1 to 5.",
            "invalid": "Enter a whole number from 1 to 5.",
        },
    )
    context_window = forms.IntegerField(
        min_value=256,
        initial=8192,
        error_messages={
            "min_value": "The context window must be at least 256 tokens.",
            "required": "Enter the context window in tokens.",
            "invalid": "Enter a whole number of tokens.",
        },
    )
    max_output_tokens = forms.IntegerField(
        min_value=1,
        initial=512,
        error_messages={
            "min_value": "Allow at least one output token.",
            "required": "Enter the maximum output tokens.",
            "invalid": "Enter a whole number of tokens.",
        },
    )
    input_price_per_mtok = forms.DecimalField(
        required=False,
        min_value=0,
        max_digits=12,
        decimal_places=6,
        label="Input price (USD / million tokens)",
        help_text="Only when genai-prices does not know the model.",
        error_messages={"min_value": "A price cannot be negative.", "invalid": "Enter a price such as 1.25."},
    )
    output_price_per_mtok = forms.DecimalField(
        required=False,
        min_value=0,
        max_digits=12,
        decimal_places=6,
        label="Output price (USD / million tokens)",
        error_messages={"min_value": "A price cannot be negative.", "invalid": "Enter a price such as 10."},
    )
    timeout_s = forms.IntegerField(
        min_value=1,
        max_value=3600,
        initial=60,
        label="Timeout (seconds)",
        error_messages={
            "min_value": "The timeout must be at least 1 second.",
            "max_value": "The timeout is at most 3600 seconds.",
            "required": "Enter a timeout in seconds.",
            "invalid": "Enter a whole number of seconds.",
        },
    )
    max_concurrency = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=1000,
        label="Max concurrency",
        help_text="Calls it takes at once; empty for no limit (a local model always runs one). "
        "Steps beyond it wait for a slot, and their timeout starts when their call does.",
        error_messages={
            "min_value": "Max concurrency is at least 1 (empty: no limit).",
            "max_value": "Max concurrency is at most 1000.",
            "invalid": "Enter a whole number of calls, or leave it empty.",
        },
    )
    fallback: forms.ModelChoiceField[Worker] = forms.ModelChoiceField(
        queryset=None,
        required=False,
        empty_label="— none —",
        help_text="Retried when this worker fails.",
        error_messages={"invalid_choice": "Choose one of your workers."},
    )
    enabled = forms.BooleanField(required=False, initial=True)

    def __init__(
        self, *args: Any, providers: Any, fallbacks: Any, editing: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        if editing:
            del self.fields["provider"]
            del self.fields["slug"]
        else:
            cast("forms.ModelChoiceField[Provider]", self.fields["provider"]).queryset = providers
        cast("forms.ModelChoiceField[Worker]", self.fields["fallback"]).queryset = fallbacks

    def service_kwargs(self) -> dict[str, Any]:
        data = dict(self.cleaned_data)
        data["tags"] = [t.strip() for t in (data.get("tags") or "").split(",") if t.strip()]
        return data


class ExistingWorkerForm(forms.Form):
    worker: forms.ModelChoiceField[Worker] = forms.ModelChoiceField(
        queryset=None,
        error_messages={"required": "Choose a worker.", "invalid_choice": "Choose a worker from the list."},
    )

    def __init__(self, *args: Any, workers: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cast("forms.ModelChoiceField[Worker]", self.fields["worker"]).queryset = workers


def _preset_conductor_field(preset: str) -> forms.ModelChoiceField[Worker]:
    return forms.ModelChoiceField(
        queryset=None,
        required=False,
        empty_label="— the pool's conductor —",
        label=f"conductor-{preset} conductor",
        help_text=f"Plans conductor-{preset} runs; empty: the pool's conductor.",
        error_messages={"invalid_choice": "Choose one of your workers."},
    )


class PoolForm(forms.Form):
    team: forms.ModelChoiceField[Team] = forms.ModelChoiceField(
        queryset=None,
        required=False,
        empty_label="— platform (superusers only) —",
        help_text="The team that owns and configures this pool.",
        error_messages={"invalid_choice": "Choose one of your teams."},
    )
    slug = forms.SlugField(
        max_length=50, error_messages=SLUG_ERRORS, help_text="Also usable as the model name in /v1."
    )
    name = forms.CharField(max_length=100, error_messages={"required": "Give the pool a name."})
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}))
    default_worker: forms.ModelChoiceField[Worker] = forms.ModelChoiceField(
        queryset=None,
        required=False,
        empty_label="— first worker —",
        error_messages={"invalid_choice": "Choose one of the pool's workers."},
    )
    conductor_worker: forms.ModelChoiceField[Worker] = forms.ModelChoiceField(
        queryset=None,
        required=False,
        empty_label="— none —",
        help_text="The model that writes the plans.",
        error_messages={"invalid_choice": "Choose one of your workers."},
    )
    # Each preset may be planned by its own model (e.g. a fine-tuned conductor on an
    # OpenAI-compatible endpoint); empty: the conductor above.
    mini_conductor = _preset_conductor_field("mini")
    ultra_conductor = _preset_conductor_field("ultra")
    enabled = forms.BooleanField(required=False, initial=True)

    def __init__(
        self,
        *args: Any,
        teams: Any = None,
        members: Any,
        conductors: Any,
        editing: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        if editing:
            del self.fields["team"]
            del self.fields["slug"]
        else:
            cast("forms.ModelChoiceField[Team]", self.fields["team"]).queryset = teams
            del self.fields["default_worker"]
        if "default_worker" in self.fields:
            cast("forms.ModelChoiceField[Worker]", self.fields["default_worker"]).queryset = members
        for name in ("conductor_worker", "mini_conductor", "ultra_conductor"):
            cast("forms.ModelChoiceField[Worker]", self.fields[name]).queryset = conductors
