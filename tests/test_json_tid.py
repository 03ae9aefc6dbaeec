"""``sim.load._tid_of``: a nested-layout node's thread is the first tid object of its raw
``attrs``, the one a regular-expression search over the whole list finds (its contract); the
reader finds it by a substring search instead. Checked against that search on hand-made lists
that put ``"tid"`` where it is not the tid attribute, and on 100,000 random lists."""
from __future__ import annotations

import random
import re

import msgspec
import pytest

from linker.sim.load import _JsonNode, _tid_of

SEARCH = re.compile(rb'\{[^{}]*"name"\s*:\s*"tid"[^{}]*\}')


def by_search(attrs: bytes) -> int:
    """The contract: the first brace-free object whose "name" is "tid", its value as an int."""
    found = SEARCH.search(attrs)
    if found is None:
        return 0
    try:
        value = msgspec.json.decode(found.group(0)).get("value")
    except msgspec.DecodeError:
        return 0
    if isinstance(value, bool) or isinstance(value, int):
        return int(value)
    return int(value) if isinstance(value, str) and value.lstrip("-").isdigit() else 0


def tid(attrs: bytes) -> int:
    return _tid_of(_JsonNode(id=1, attrs=msgspec.Raw(attrs)))


@pytest.mark.parametrize("attrs, expected", [
    (b'[{"name": "rf_id", "type": "uint64", "value": 6}, {"name": "tid", "type": "uint64", "value": 3}]', 3),
    (b'[{"name" : "tid" , "value" : 9}]', 9),
    (b'["tid", {"name": "tid", "value": 2}]', 2),  # a bare "tid" string before the object
    (b'[{"value": "tid", "name": "scope"}, {"name": "tid", "value": 4}]', 4),  # "tid" as a value
    (b'[{"tid": 5}, {"name": "tid", "value": "11"}]', 11),  # "tid" as a key
    (b'[{"name": "op", "value": {"name": "tid", "value": 3}}]', 3),  # the inner object is brace-free
    (b'[{"name": "tid", "value": true}]', 1),
    (b'[{"name": "tids", "value": 8}]', 0),
    (b'[{"name": "tid", "value": 1', 0),  # cut short: no closing brace
    (b'null', 0),
])
def test_the_tid_attribute_is_the_first_tid_object(attrs, expected):
    assert by_search(attrs) == expected
    assert tid(attrs) == expected
    assert tid(attrs) == expected  # again, with its text remembered


def test_random_lists_give_what_the_search_gives():
    rng = random.Random(7)
    pieces = [b'{"name": "tid", "value": 7}', b'{"name":"tid","type":"uint64","value":2}', b'{"value": "tid"}',
              b'{"tid": 1}', b'{"name": "rf_id", "value": 5}', b"{", b"}", b'"tid"', b'"name"', b":", b",", b" ",
              b'"value"', b"1", b'"x"', b"[", b"]"]
    lists = [b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 12))) for _ in range(100_000)]
    assert sum(by_search(attrs) != 0 for attrs in lists) > 10_000  # the lists do hold tid objects
    assert [tid(attrs) for attrs in lists] == [by_search(attrs) for attrs in lists]
