"""Request validation and request ids, without Ray or a server."""

import pytest

from rollout import Settings
from serve.common.errors import InputTooLarge, InvalidInput
from serve.gateway.schemas import max_body_bytes, parse_predict, request_id_from

SETTINGS = Settings(max_items=3, max_item_chars=10, max_total_chars=20)


def test_valid_request_is_parsed():
    request = parse_predict(b'{"inputs": ["a", "b"], "task": "embed"}', SETTINGS)
    assert request.inputs == ["a", "b"] and request.task == "embed"
    assert parse_predict(b'{"inputs": ["a"]}', SETTINGS).task is None


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"{", "not valid JSON"),
        (b"[]", "body"),
        (b'{"inputs": []}', "inputs"),
        (b'{"inputs": [""]}', "inputs[0] is empty"),
        (b'{"inputs": ["a", "\\t "]}', "inputs[1] is empty"),
        (b'{"inputs": [3]}', "inputs.0"),
        (b'{"inputs": "a"}', "inputs"),
        (b'{"inputs": ["a"], "task": "x"}', "task"),
        (b'{"inputs": ["a"], "other": 1}', "other"),
    ],
)
def test_shape_errors_are_invalid_input_naming_the_field(body, fragment):
    with pytest.raises(InvalidInput) as info:
        parse_predict(body, SETTINGS)
    assert fragment in info.value.message
    assert info.value.status == 422


@pytest.mark.parametrize(
    ("inputs", "fragment"),
    [
        (["a", "b", "c", "d"], "4 inputs"),
        (["x" * 11], "inputs[0] has 11 characters"),
        (["x" * 10, "y" * 10, "z"], "total 21 characters"),
    ],
)
def test_size_errors_are_input_too_large(inputs, fragment):
    import json

    with pytest.raises(InputTooLarge) as info:
        parse_predict(json.dumps({"inputs": inputs}).encode(), SETTINGS)
    assert fragment in info.value.message
    assert info.value.status == 413


def test_oversized_body_is_refused_before_parsing():
    body = b"{" * (max_body_bytes(SETTINGS) + 1)  # not even JSON: size is checked first
    with pytest.raises(InputTooLarge):
        parse_predict(body, SETTINGS)


def test_limits_allow_escaped_json_at_the_character_limit():
    import json

    text = "\u2603" * 10  # ten characters, each escaped to six bytes by ensure_ascii
    body = json.dumps({"inputs": [text, text]}).encode()
    assert parse_predict(body, SETTINGS).inputs == [text, text]


@pytest.mark.parametrize("good", ["abc", "req-42", "0f3c:trace/1", "a" * 128])
def test_well_formed_request_ids_are_echoed(good):
    assert request_id_from(good) == good


@pytest.mark.parametrize("bad", [None, "", "has space", "a" * 129, "x\r\nSet-Cookie: y", "é"])
def test_malformed_request_ids_are_replaced(bad):
    rid = request_id_from(bad)
    assert rid != bad and len(rid) == 32 and rid.isalnum()
