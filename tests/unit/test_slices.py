"""Slices (rollout.slices): an input's script, length bucket and keys, the bounded header
values, and the slice table worst first."""

from __future__ import annotations

import pytest

from rollout.agreement import wilson_interval
from rollout.slices import (
    LENGTH_EDGES,
    MAX_HEADER_CHARS,
    MAX_HEADER_VALUES,
    HeaderValues,
    SliceCounts,
    length_bucket,
    script_of,
    slice_table,
    slices_of,
    tokens_per_input,
    worst_rows,
)


@pytest.mark.parametrize(("text", "script"), [
    ("The match ended in a draw.", "latin"),
    ("Ça coûte 5 €, très cher!", "latin"),
    ("Матч закончился вничью.", "cyrillic"),
    ("Ο αγώνας έληξε ισόπαλος.", "greek"),
    ("انتهت المباراة بالتعادل", "arabic"),
    ("המשחק הסתיים בתיקו", "hebrew"),
    ("比赛以平局结束。", "han"),
    ("東京で会いましょう", "kana"),  # kanji with kana: Japanese
    ("東京タワー", "kana"),  # two kanji, three katakana (one the prolonged sound mark)
    ("ｶﾀｶﾅ", "kana"),  # half-width katakana
    ("경기는 무승부로 끝났다", "hangul"),
    ("मैच ड्रॉ पर समाप्त हुआ", "devanagari"),
    ("การแข่งขันจบลงด้วยการเสมอ", "thai"),
    ("ሰላም", "other"),  # Ethiopic
    ("😀🎉🔥", "none"),
    ("12345 !?", "none"),
    ("", "none"),
    ("   \n\t", "none"),
    ("Ｆｕｌｌ", "latin"),  # full-width Latin
])
def test_script_of(text, script):
    assert script_of(text) == script


def test_mixed_scripts_take_the_most_letters():
    assert script_of("Hello мир, как дела") == "cyrillic"
    assert script_of("Apple 发布了 new iPhone") == "latin"
    assert script_of("iPhone 发布了新的手机产品") == "han"


def test_a_tie_goes_to_the_script_seen_first():
    assert script_of("ab аб") == "latin"
    assert script_of("аб ab") == "cyrillic"


def test_only_the_first_characters_are_read():
    from rollout.slices import SCAN_CHARS
    assert script_of("a" * SCAN_CHARS + "б" * (SCAN_CHARS * 2)) == "latin"


@pytest.mark.parametrize(("tokens", "bucket"), [
    (0, "1-16"), (1, "1-16"), (16, "1-16"), (17, "17-64"), (64, "17-64"), (65, "65-128"),
    (128, "65-128"), (129, "129+"), (10_000, "129+"),
])
def test_length_bucket_edges(tokens, bucket):
    assert LENGTH_EDGES == (16, 64, 128)
    assert length_bucket(tokens) == bucket


def test_slices_of():
    assert slices_of("比赛以平局结束。", 20, "sports", "acme") == (
        "script:han", "length:17-64", "label:sports", "header:acme")
    assert slices_of("hello", 3, None) == ("script:latin", "length:1-16")
    assert slices_of("", 2, "sports") == ("script:none", "length:1-16", "label:sports")


def test_tokens_per_input():
    assert tokens_per_input(12, ["only one"]) == [12]
    assert tokens_per_input(30, ["ab", "abcd"]) == [10, 20]
    assert tokens_per_input(4, ["", ""]) == [2, 2]
    assert tokens_per_input(0, []) == []


def test_header_values_are_capped_in_number():
    values = HeaderValues()
    assert [values.admit(f"tenant-{i}") for i in range(MAX_HEADER_VALUES)] == [
        f"tenant-{i}" for i in range(MAX_HEADER_VALUES)]
    assert values.admit("one-too-many") == "other"
    assert values.admit("tenant-3") == "tenant-3"  # a value already seen keeps its slice
    assert len(values.seen) == MAX_HEADER_VALUES


def test_header_values_are_capped_in_length_and_printable():
    values = HeaderValues(max_values=4)
    assert values.admit("x" * 500) == "x" * MAX_HEADER_CHARS
    assert values.admit("  acme\x00\x1b[31m\n ") == "acme[31m"
    assert values.admit(None) is None
    assert values.admit(" \t") is None
    assert values.admit("\x00\x01") is None


def test_slice_counts_and_table_worst_first():
    counts = SliceCounts()
    for i in range(100):
        counts.add(("script:latin", "label:a"), agreed=i != 0)
    for i in range(60):
        counts.add(("script:han", "label:a"), agreed=i % 2 == 0, confident_flip=i % 2 == 1)
    for _ in range(5):
        counts.add(("script:kana",), agreed=False, confident_flip=True)
    assert counts.counts["script:han"] == (60, 30, 30)
    assert counts.counts["label:a"] == (160, 129, 30)
    rows = slice_table(counts.counts, min_size=50)
    assert [(r.slice, r.judged) for r in rows] == [
        ("script:han", True), ("label:a", True), ("script:latin", True),
        ("script:kana", False)]
    han = rows[0]
    assert han.agreement == 0.5 and han.confident_flips == 30
    assert han.lower_bound == pytest.approx(wilson_interval(30, 60)[0])
    assert rows[-1].agreement == 0.0  # not judged: after every judged row however bad
    assert rows[0].as_dict()["slice"] == "script:han"


def test_table_ties_by_name_and_empty_slices():
    rows = slice_table({"b": (10, 10, 0), "a": (10, 10, 0), "z": (0, 0, 0)}, min_size=1)
    assert [r.slice for r in rows] == ["a", "b", "z"]
    assert rows[-1].agreement is None and rows[-1].lower_bound is None
    assert worst_rows(rows, 2) == (rows[:2], 1)
    assert worst_rows(rows) == (rows, 0)
