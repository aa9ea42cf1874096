"""Inflating a compressed request body (`kubeinfer.runtime.http.body.inflate`).

Covers: a body inflates whole when it fits; past the byte limit it stops with a 413 as
soon as a part passes it; a small body that inflates to millions of empty JSON lists
stops with a 413 at its first part when the model bounds the JSON values, whatever the
byte limit (so a raised limit does not let it grow); with the binary extension only the
JSON header counts (tensor bytes that happen to be commas do not); corrupt, truncated
and trailing data are 400s.
"""

from __future__ import annotations

import gzip
import json
import zlib

import pytest
from kubeinfer.runtime.http.body import inflate
from kubeinfer.runtime.protocol.errors import InvalidRequest, RequestTooLarge

MIB = 1024 * 1024


def test_a_body_that_fits_inflates_whole() -> None:
    document = json.dumps({"inputs": [{"data": list(range(1000))}]}).encode()
    assert inflate(gzip.compress(document), "gzip", len(document)) == document
    assert inflate(zlib.compress(document), "deflate", len(document), 2000) == document


def test_past_the_byte_limit_it_stops() -> None:
    with pytest.raises(RequestTooLarge, match="inflates past the limit of 1000"):
        inflate(gzip.compress(b" " * 5000), "gzip", 1000)


def test_millions_of_empty_lists_stop_at_the_first_part_whatever_the_limit() -> None:
    bomb = gzip.compress(b"[" + b"[]," * (21 * MIB) + b"[]]", 9)  # 64 MiB inflated
    assert len(bomb) < 128 * 1024
    with pytest.raises(RequestTooLarge, match="was not parsed"):
        inflate(bomb, "gzip", 64 * MIB, max_json_values=20_000)


def test_only_the_json_header_of_a_binary_body_counts() -> None:
    header = b'{"inputs": [{"name": "x", "parameters": {"binary_data_size": 4096}}]}'
    body = header + b"," * 4096
    assert inflate(gzip.compress(body), "gzip", MIB, 50, len(header)) == body
    with pytest.raises(RequestTooLarge):
        inflate(gzip.compress(body), "gzip", MIB, 50)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"not gzip at all", "corrupt"),
        (gzip.compress(b"x" * 100, mtime=0)[:-8], "truncated"),
        (gzip.compress(b"x" * 100, mtime=0) + b"tail", "trailing"),
    ],
    ids=["not-gzip", "truncated", "trailing"],
)
def test_broken_streams_are_400(body: bytes, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        inflate(body, "gzip", MIB)
