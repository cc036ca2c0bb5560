"""``/v1``: protocol adapters over one run bridge.

- ``errors``  — the error every adapter raises (``OpenAIError``) and its renderings (OpenAI's
  shape, Anthropic's shape), plus the answer for unknown ``/v1`` paths.
- ``bridge``  — protocol-neutral: API-key auth, model resolution, the neutral run request,
  ``start_run``, following a run, outcome/held/usage helpers and the response headers.
- ``chat``    — OpenAI Chat Completions and the ``models`` views.
- ``middleware`` — request id, processing time, rate-limit headers and CORS on every ``/v1``
  response.
"""
