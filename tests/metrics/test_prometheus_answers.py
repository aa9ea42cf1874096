"""How the Prometheus source reads an answer of the query API (`query_result`) and a
failed connection (`cause`), from the status, the JSON body and the exceptions' chain
alone: no exception's text is parsed."""

from __future__ import annotations

import json
import socket

import pytest
import requests
from kubeinfer.operator.metrics_sources.prometheus import NOT_A_RESULT, Refused, cause, query_result


def body(**envelope: object) -> str:
    return json.dumps(envelope)


VECTOR = [{"metric": {"pod": "a"}, "value": [1.0, "2"]}]


@pytest.mark.parametrize(
    ("status", "text", "expected"),
    [
        (200, body(status="success", data={"resultType": "vector", "result": VECTOR}),
         ("vector", VECTOR)),
        (200, body(status="success", data={"resultType": "scalar", "result": [1.0, "3"]}),
         ("scalar", [1.0, "3"])),
        (200, body(status="success", data={"resultType": "vector", "result": []}),
         ("vector", [])),
    ],
)  # fmt: skip
def test_a_query_result_is_its_type_and_result(status, text, expected):
    assert query_result(status, text) == expected


@pytest.mark.parametrize(
    ("status", "text", "reason"),
    [
        (400, body(status="error", errorType="bad_data", error="parse error: unclosed ("),
         "HTTP 400: parse error: unclosed ("),
        (503, body(status="error", errorType="unavailable", error="too many queries"),
         "HTTP 503: too many queries"),
        (404, body(error="no route GET /api/v1/query"), "HTTP 404: no route GET /api/v1/query"),
        (502, "<html>Bad Gateway</html>", "HTTP 502"),
        (404, body(), "HTTP 404"),
        (200, "<html>a login page</html>", NOT_A_RESULT),
        (200, body(status="success", data=[1]), NOT_A_RESULT),
        (200, body(status="success"), NOT_A_RESULT),
        (200, "[1, 2]", NOT_A_RESULT),
        (422, body(status="error", error="x" * 1000), "HTTP 422: " + "x" * 300),
    ],
)  # fmt: skip
def test_an_answer_that_is_no_result_says_why(status, text, reason):
    with pytest.raises(Refused) as refused:
        query_result(status, text)
    assert str(refused.value) == reason


def test_a_refused_connection_is_said_in_the_systems_words():
    with socket.socket() as unused:  # bound, never listening: connections are refused
        unused.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{unused.getsockname()[1]}/"
        with pytest.raises(requests.ConnectionError) as error:
            requests.get(url, timeout=5)
    assert cause(error.value) == "Connection refused"


def test_without_an_os_error_the_type_is_said():
    try:
        try:
            raise KeyError("inner")
        except KeyError:
            raise requests.ConnectionError("wrapped") from None
    except requests.ConnectionError as error:
        assert cause(error) == "ConnectionError"
