"""The coordinator's payload check (``convert.check_json``): orjson first, and the json module
for what orjson refuses: a payload is accepted when json accepts it (nesting aside)."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardq.common.errors import InvalidArgument
from shardq.coordinator.convert import check_json

# JSON that orjson refuses and the json module reads: each is accepted through the fallback.
ORJSON_REFUSES = [
    b"1" + b"0" * 400,  # an integer past a float's range (past 64 bits, orjson reads floats)
    b"-1e999",  # a number past a float's range
    b'"\\ud800"',  # an escaped lone surrogate
    b'{"a": ["\\udfff", 1e400]}',
]

NOT_JSON = [
    b"NaN",
    b"[Infinity]",
    b"-Infinity",
    b"\xef\xbb\xbf5",  # a UTF-8 BOM
    b'"\xed\xa0\x80"',  # a surrogate encoded in UTF-8
    b"\xff",
    b"5 x",
    b"'a'",
    b"01",
    b"[1,]",
    b'"\x01"',
    '{"a": 1}'.encode("utf-16"),
    '{"a": 1}'.encode("utf-32"),
    b"[" * 2_000 + b"]" * 2_000,
]


@pytest.mark.parametrize("doc", ORJSON_REFUSES)
def test_what_orjson_refuses_and_json_reads_is_accepted(doc: bytes) -> None:
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(doc)  # the fallback is what accepts it
    json.loads(doc)
    assert check_json(doc) == doc


@pytest.mark.parametrize("doc", NOT_JSON)
def test_what_is_not_a_utf8_json_document_is_refused_with_the_field_named(doc: bytes) -> None:
    with pytest.raises(InvalidArgument) as err:
        check_json(doc, "job.payload")
    assert err.value.field == "job.payload"


def test_an_empty_payload_stands_for_null() -> None:
    assert check_json(b"") == b"null"


def test_nesting_is_decided_as_json_decides_it() -> None:
    assert check_json(b"[" * 400 + b"]" * 400)
    # Past orjson's limit of 1,024 levels and json's (the recursion limit, 1,000).
    with pytest.raises(InvalidArgument):
        check_json(b"[" * 1_025 + b"]" * 1_025)
    # json alone decides a payload that could nest deeper than it reads: accepted by json
    # where it would be by orjson, refused at json's limit where orjson (1,024) would not be.
    assert check_json(b"[" + b"[]," * 900 + b"[]]")
    with pytest.raises(InvalidArgument, match="nested too deeply"):
        check_json(b"[" * 1_000 + b"]" * 1_000)
    orjson.loads(b"[" * 1_000 + b"]" * 1_000)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(json_values, st.booleans())
def test_a_document_is_accepted_exactly_when_json_reads_it_as_utf8(
    value: Any, ascii_only: bool
) -> None:
    # ensure_ascii off writes a lone surrogate raw: not UTF-8, refused by both.
    doc = json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    try:
        json.loads(doc.decode("utf-8"))
    except UnicodeDecodeError:
        with pytest.raises(InvalidArgument):
            check_json(doc)
        return
    assert check_json(doc) == doc


#: Bytes near JSON's grammar, where two parsers would disagree if they do: numbers cut short
#: ("1.", "-", ".5", "1e"), literals cut short, escapes, stray whitespace and brackets.
near_json = st.text(alphabet=' \t\n\r\x0c[]{}",:0123456789.eE+-truefalsnINaIy\\/u\xe9', max_size=24)


@given(near_json.map(lambda text: text.encode("utf-8")) | st.binary(max_size=24))
def test_any_bytes_are_accepted_exactly_when_json_reads_them(doc: bytes) -> None:
    try:
        json.loads(doc.decode("utf-8"), parse_constant=_refuse)
        ok = True
    except (ValueError, RecursionError):
        ok = False
    if not doc:
        assert check_json(doc) == b"null"
    elif ok:
        assert check_json(doc) == doc
    else:
        with pytest.raises(InvalidArgument):
            check_json(doc)


def _refuse(name: str) -> Any:
    raise ValueError(name)
