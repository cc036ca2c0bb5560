"""``/v1``: protocol adapters over one run bridge.

- ``errors``   — the error every adapter raises (``ApiError``) and its renderings (OpenAI's
  shape, Anthropic's shape), plus the answer for unknown ``/v1`` paths.
- ``auth``     — per-request state, API-key authentication, rate-limit and run headers.
- ``targets``  — model resolution (``resolve_model``: preset / pool), the model list, capabilities.
- ``run_request`` — the neutral run request (``RunRequest``) and the question made from a chat.
- ``bridge``   — ``start_run``: authenticate, parse, check and create the run (re-exports ``follow``).
- ``follow``   — following a run: ``wait_for_run``, ``follow_run`` (``RunFollower``).
- ``shaping``  — the answer from a run: outcome errors, final answer, usage, ``conductor`` field,
  SSE and progress.
- ``chat``, ``responses``, ``messages`` — the protocol adapters (and the ``models`` views);
  ``chat_request``, ``responses_request`` parse their bodies, ``responses_output`` shapes a
  response object.
- ``live_stream`` — the fast pass-through every adapter's stream takes when a one-worker pool
  answers with nothing that needs the whole answer (``X-Conductor-Stream: direct``; issue 45).
- ``embeddings`` — ``POST /v1/embeddings``: not a run; the pool's default worker embeds through
  the team's outbound gate (issue 45).
- ``middleware`` — request id, processing time, rate-limit headers and CORS on every ``/v1``
  response.
"""
