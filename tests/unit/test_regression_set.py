"""The shipped regression set and the JSONL loader."""

import json
from collections import Counter

import pytest

from ops.generate.regression_set import OUTPUT, generate, render
from rollout.settings import DEFAULT_LABELS
from serve.common.regression import DEFAULT_SET, RegressionSetError, load_set


def test_shipped_set_is_the_generators_output():
    assert OUTPUT == DEFAULT_SET
    assert DEFAULT_SET.read_text(encoding="utf-8") == render(generate())


def test_shipped_set_is_big_varied_and_small_on_disk():
    regression = load_set(None, DEFAULT_LABELS)
    assert len(regression) >= 2000
    assert DEFAULT_SET.stat().st_size < 1_000_000
    kinds = Counter(e.meta["kind"] for e in regression.examples)
    for kind in ("topical", "boundary", "short", "long", "near-limit", "unicode", "multilingual",
                 "code", "numbers", "near-duplicate", "salad"):
        assert kinds[kind] >= 50, kind
    texts = regression.texts
    assert max(len(t.split()) for t in texts) > 300  # past the 256-token limit
    assert min(len(t) for t in texts) <= 3
    assert any(ord(ch) > 0x1F000 for t in texts for ch in t)  # emoji
    assert any("\u4e00" <= ch <= "\u9fff" for t in texts for ch in t)  # CJK
    labelled = [e for e in regression.examples if e.label]
    assert len(labelled) > 1000 and {e.label for e in labelled} == set(DEFAULT_LABELS)
    splits = [set(regression.calibration()), set(regression.validation()),
              set(regression.held_out())]
    folded = regression.folded("validation") + regression.folded("held-out")
    assert folded > 0 and regression.folded("calibration") == 0  # tuning keeps its copies
    assert sum(map(len, splits)) == len(regression) - folded  # each input in one split at most
    texts = [{regression.texts[i] for i in split} for split in splits]
    assert not (texts[0] & texts[1] or texts[0] & texts[2] or texts[1] & texts[2])  # no copies
    assert set.union(*texts) == set(regression.texts)  # every text is in one
    for judged in splits[1:]:  # each distinct text once in a judged split
        assert len({regression.texts[i] for i in judged}) == len(judged)
    # validation as large as the held-out split: auto's bound has verify's power
    assert abs(len(splits[1]) - len(splits[2])) <= 0.02 * len(regression)
    assert len(splits[2]) >= len(regression) * 0.35


def test_a_judged_split_counts_a_repeated_text_once(tmp_path):
    """Index 5 and 6 (held-out by index) and 9 repeat the text first seen at 1 (validation):
    they keep its split and are folded into that first occurrence, counted once."""
    path = tmp_path / "dups.jsonl"
    texts = [f"text {i}" for i in range(10)]
    texts[5] = texts[6] = texts[9] = texts[1]
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    regression = load_set(path)

    assert regression.validation() == [1, 2, 3]
    assert regression.held_out() == [7]
    assert (regression.folded("validation"), regression.folded("held-out")) == (3, 0)
    assert regression.distinct() == [0, 1, 2, 3, 4, 7, 8]


def test_generation_is_deterministic():
    assert generate() == generate()
    assert generate(seed=1) != generate()


def test_user_sets_load_with_optional_labels(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text('{"text": "hello", "label": "sports"}\n\n{"text": "bye", "id": 7}\n')
    regression = load_set(path, ("sports", "health"))
    assert [(e.text, e.label) for e in regression.examples] == [("hello", "sports"), ("bye", None)]
    assert regression.examples[1].meta == {"id": 7}
    assert len(regression.digest) == 16
    assert regression.limited(1).texts == ["hello"]
    assert regression.limited(1).digest != regression.digest


@pytest.mark.parametrize(("content", "message"), [
    ("not json\n", ":1: not JSON"),
    ('{"text": "a"}\n[1]\n', ":2: expected a JSON object"),
    ('{"text": ""}\n', "`text` must be a non-empty string"),
    ('{"label": "sports"}\n', "`text` must be a non-empty string"),
    ('{"text": "a", "label": "cooking"}\n', "'cooking' is not one of the model's labels"),
    ("\n\n", "has no inputs"),
])
def test_malformed_sets_name_the_line(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(RegressionSetError, match=message.replace("[", r"\[")):
        load_set(path, ("sports", "health"))


def test_a_missing_set_is_a_clear_error(tmp_path):
    with pytest.raises(RegressionSetError, match="cannot read regression set"):
        load_set(tmp_path / "nope.jsonl")


def test_every_line_is_one_json_object():
    for line in DEFAULT_SET.read_text(encoding="utf-8").splitlines():
        assert set(json.loads(line)) <= {"text", "label", "kind"}
