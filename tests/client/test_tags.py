import pytest
import xxhash

from gms.tags import MATCH_ALL, BadTagExpression, parse_tag_expression, tag_hash


@pytest.mark.parametrize("expr", [None, "", "*", "  *  "])
def test_match_all(expr):
    f = parse_tag_expression(expr)
    assert f is MATCH_ALL and f.hashes is None and f.matches(None) and f.matches("x")


def test_or_expression():
    f = parse_tag_expression("A || B||C")
    assert f.tags == {"A", "B", "C"}
    assert f.matches("B") and not f.matches("D") and not f.matches(None)
    assert f.hashes == {tag_hash("A"), tag_hash("B"), tag_hash("C")}


def test_tag_hash_is_signed_xxh64_and_zero_for_no_tag():
    assert tag_hash(None) == tag_hash("") == 0
    for tag in ["A", "order-created", "ü"]:
        h = tag_hash(tag)
        assert -(1 << 63) <= h < (1 << 63)
        assert h % (1 << 64) == xxhash.xxh64_intdigest(tag.encode())


@pytest.mark.parametrize("bad", ["A ||", "|| A", "A | B", "A || *", "A B", "x" * 256])
def test_bad_expressions(bad):
    with pytest.raises(BadTagExpression):
        parse_tag_expression(bad)
