"""The JSONL rules of an evaluation set, line by line (pure: no database)."""

from __future__ import annotations

import json

import pytest

from apps.experiments.datasets import MAX_FILE_BYTES, MAX_LINES, DatasetInvalid, parse_jsonl


def _jsonl(*rows: object) -> bytes:
    return "\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows).encode()


def test_good_file_with_both_shapes() -> None:
    items = parse_jsonl(
        _jsonl(
            {"input": "What is 2+2?", "reference": "4", "tags": ["math"]},
            "",
            {
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Capital of France?"},
                ]
            },
        )
    )
    assert [i.index for i in items] == [1, 3]  # blank lines keep the numbering of the file
    assert items[0].messages == [{"role": "user", "content": "What is 2+2?"}]
    assert items[0].reference == "4" and items[0].tags == ["math"]
    assert items[1].reference is None and items[1].messages[0]["role"] == "system"


def test_every_bad_line_is_listed_with_its_number_and_reason() -> None:
    with pytest.raises(DatasetInvalid) as exc:
        parse_jsonl(
            _jsonl(
                {"input": "fine", "reference": "x"},
                "{not json",
                {"reference": "no question"},
                {"input": 42},
                {"input": "   "},
                {"messages": [{"role": "user", "content": ""}]},
                {"messages": [{"role": "robot", "content": "hi"}]},
                {"input": "q", "tags": "math"},
                {"input": "q", "reference": 4},
                {"input": "x" * 20_001},
                [1, 2],
                {"input": "q", "extra": 1},
                {"messages": "hello"},
            )
        )
    errors = exc.value.errors
    assert errors == [
        "line 2: invalid JSON (Expecting property name enclosed in double quotes at column 2)",
        'line 3: missing "messages" (or the "input" shorthand)',
        'line 4: "input" must be a string, got int',
        'line 5: "input" is empty',
        "line 6: messages[0].content is empty",
        "line 7: messages[0].role must be one of system, user, assistant",
        'line 8: "tags" must be a list of non-empty strings',
        'line 9: "reference" must be a string, got int',
        "line 10: the question is 20,001 characters; the limit is 20,000",
        "line 11: each line must be a JSON object, got list",
        "line 12: unknown field 'extra' (allowed: input, messages, reference, tags)",
        'line 13: "messages" must be a non-empty list of {"role", "content"} objects',
    ]


def test_file_level_limits() -> None:
    with pytest.raises(DatasetInvalid, match="the limit is 2,000"):
        parse_jsonl(_jsonl(*[{"input": f"q{i}"} for i in range(MAX_LINES + 1)]))
    with pytest.raises(DatasetInvalid, match="5 MB"):
        parse_jsonl(b"x" * (MAX_FILE_BYTES + 1))
    with pytest.raises(DatasetInvalid, match="no lines"):
        parse_jsonl(b"\n \n")
    with pytest.raises(DatasetInvalid, match="line 2: not UTF-8"):
        parse_jsonl(b'{"input": "a"}\n\xff\xfe')
    assert len(parse_jsonl(_jsonl(*[{"input": f"q{i}"} for i in range(MAX_LINES)]))) == MAX_LINES


def test_many_bad_lines_are_capped_in_the_report() -> None:
    with pytest.raises(DatasetInvalid) as exc:
        parse_jsonl(_jsonl(*["nope"] * 60))
    assert len(exc.value.errors) == 51 and exc.value.errors[-1] == "… and 10 more bad lines"
