"""`parsers.schema_values` converts parameter values as vLLM 0.33 does.

The table was produced by running the same (value, schema) pairs through vLLM 0.33.0's
`coerce_to_schema_type(value, extract_types_from_schema(schema))` and `json.dumps(...,
ensure_ascii=False)` (1176 pairs, all equal; a spread of them is kept here as facts). The golden
cases `qwen3-coder/derender/typed_*` check the same rules end to end.
"""

from __future__ import annotations

from typing import Any

import pytest

from parsers.schema_values import STRING, convert_value, schema_types, tool_parameter_types

# (value as the model wrote it, parameter schema, the JSON text vLLM 0.33 writes)
VLLM_033: list[tuple[str, dict[str, Any], str]] = [
    ("-0.0", {"allOf": [{"type": "array"}]}, "-0.0"),
    ("true", {"allOf": [{"type": "array"}]}, "true"),
    ("-0.0", {"anyOf": [{"type": "integer"}, {"type": "null"}]}, "-0.0"),
    ("0", {"anyOf": [{"type": "integer"}, {"type": "null"}]}, "0"),
    ("2.5", {"anyOf": [{"type": "integer"}, {"type": "null"}]}, "2.5"),
    ("0", {"enum": [1, 2]}, "0"),
    ("2.0", {"enum": [1, 2]}, "2.0"),
    ('{"a": 1.0}', {"enum": [1, 2]}, '{"a": 1.0}'),
    ("٣", {"enum": [1, 2]}, "3"),
    ('["é", {"x": [true, null]}]', {"enum": [1.5, [1], {"a": 1}]}, '["é", {"x": [true, null]}]'),
    ('{"a": 1.0}', {"enum": [1.5, [1], {"a": 1}]}, '{"a": 1.0}'),
    ("1.5e300", {"enum": [True, None]}, "1.5e+300"),
    ("12345678901234567890123", {"enum": [True, None]}, "12345678901234567890123"),
    ("1e5", {"enum": [True, None]}, "100000.0"),
    ("2.5", {"enum": [True, None]}, "2.5"),
    ("3.14", {"enum": [True, None]}, "3.14"),
    ('{"a": 1.0}', {"enum": [True, None]}, '{"a": 1.0}'),
    ("-0.0", {"oneOf": [{"type": "number"}, {"type": "string"}]}, "0"),
    ("-1e-3", {"oneOf": [{"type": "number"}, {"type": "string"}]}, "-0.001"),
    (
        "12345678901234567890123",
        {"oneOf": [{"type": "number"}, {"type": "string"}]},
        "12345678901234567890123",
    ),
    ("1e5", {"type": "array"}, "100000.0"),
    ("null", {"type": "array"}, "null"),
    ('{"a": 1.0}', {"type": "array"}, '{"a": 1.0}'),
    ("1.0", {"type": "bool"}, "1.0"),
    ("3.14", {"type": "bool"}, "3.14"),
    ("FALSE", {"type": "bool"}, "false"),
    ("true", {"type": "bool"}, "true"),
    ("True", {"type": "boolean"}, "true"),
    ("[1, 2]", {"type": "boolean"}, "[1, 2]"),
    (" 12 ", {"type": "custom"}, "12"),
    ('"s"', {"type": "custom"}, '"s"'),
    (" 12 ", {"type": "double"}, "12"),
    ("+5", {"type": "double"}, "5"),
    (
        "1.5e300",
        {"type": "double"},
        "1500000000000000078757140382806630373056702871662238732373781173267703686983362293679557062620671796065556665749325817265413784853040645863467188277180060474272580801389863705606745350692182135089053429852456199917621678558451461320111979114170213741868888183230085264257173504208294580298189100810240",
    ),
    ("12345678901234567890123", {"type": "double"}, "12345678901234567890123"),
    ("1e5", {"type": "double"}, "100000"),
    ("True", {"type": "double"}, '"True"'),
    ('{"a": 1.0}', {"type": "double"}, '{"a": 1.0}'),
    (" true ", {"type": "float"}, "true"),
    ("1.0", {"type": "float"}, "1"),
    ("3.14", {"type": "float"}, "3.14"),
    ('{"a": 1.0}', {"type": "float"}, '{"a": 1.0}'),
    ("null", {"type": "int"}, "null"),
    ("true", {"type": "int"}, "true"),
    ('{"a": 1.0}', {"type": "int"}, '{"a": 1.0}'),
    (" true ", {"type": "integer"}, "true"),
    ("-1e-3", {"type": "integer"}, "-0.001"),
    ("1_000", {"type": "integer"}, "1000"),
    ("[1, 2]", {"type": "integer"}, "[1, 2]"),
    ("-0", {"type": "null"}, "0"),
    ("12345678901234567890123", {"type": "null"}, "12345678901234567890123"),
    ("[1, 2]", {"type": "null"}, "[1, 2]"),
    ("12345678901234567890123", {"type": "number"}, "12345678901234567890123"),
    ("0", {"type": "object"}, "0"),
    ('{"a":1}', {"type": "object"}, '{"a": 1}'),
    (" 12 ", {"type": ["Integer", " INT "]}, "12"),
    ("-0", {"type": ["Integer", " INT "]}, "0"),
    ("1", {"type": ["Integer", " INT "]}, "1"),
    ("-1e-3", {"type": ["integer", "boolean"]}, "-0.001"),
    ("1.0", {"type": ["integer", "boolean"]}, "1.0"),
    ("true", {"type": ["integer", "boolean"]}, "true"),
    ("٣", {"type": ["integer", "boolean"]}, "3"),
    (" true ", {"type": ["integer", "null"]}, "true"),
    ("3.14", {"type": ["integer", "null"]}, "3.14"),
    ("1e5", {"type": ["number", "string"]}, "100000"),
    ("+5", {"type": ["number", 5]}, "5"),
    (
        "1.5e300",
        {"type": ["number", 5]},
        "1500000000000000078757140382806630373056702871662238732373781173267703686983362293679557062620671796065556665749325817265413784853040645863467188277180060474272580801389863705606745350692182135089053429852456199917621678558451461320111979114170213741868888183230085264257173504208294580298189100810240",
    ),
    ("1e5", {"type": ["number", 5]}, "100000"),
    ("٣", {"type": ["number", 5]}, "3"),
    ("NULL", {}, '"NULL"'),
]


@pytest.mark.parametrize(("value", "schema", "expected"), VLLM_033)
def test_value_is_converted_as_vllm_does(value: str, schema: dict[str, Any], expected: str) -> None:
    assert convert_value(value, schema_types(schema)) == expected


@pytest.mark.parametrize(
    ("schema", "types"),
    [
        ({"type": "integer"}, {"integer"}),
        ({"type": " INT "}, {"integer"}),
        ({"type": "float"}, {"number"}),
        ({"type": ["string", "null"]}, {"string", "null"}),
        ({"anyOf": [{"type": "integer"}, {"type": "null"}]}, {"integer", "null"}),
        ({"oneOf": [{"type": "number"}, {"allOf": [{"type": "bool"}]}]}, {"number", "boolean"}),
        (
            {"enum": ["a", 1, True, None, 1.5, [1], {"k": 1}]},
            {"string", "integer", "boolean", "null", "number", "array", "object"},
        ),
        ({"type": ["number", 5]}, {"number"}),
        ({"description": "no type"}, {"string"}),
        ({}, {"string"}),
        ("not a schema", {"string"}),
    ],
)
def test_schema_types(schema: Any, types: set[str]) -> None:
    assert schema_types(schema) == types


def test_tool_parameter_types_keeps_only_non_strings_and_the_first_tool_of_a_name() -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "f",
                "parameters": {
                    "properties": {
                        "s": {"type": "string"},
                        "n": {"type": "int"},
                        "e": {"enum": ["x"]},
                        "o": {},
                    }
                },
            },
        },
        {
            "type": "function",
            "function": {"name": "f", "parameters": {"properties": {"s": {"type": "integer"}}}},
        },
        {"type": "function", "function": {"name": "g"}},
    ]
    assert tool_parameter_types(tools) == {"f": {"n": frozenset({"integer"})}, "g": {}}
    assert frozenset({"string"}) == STRING


def test_deep_json_is_kept_as_text_not_a_crash() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    assert convert_value(deep, frozenset({"array"})).startswith('"[[[')
