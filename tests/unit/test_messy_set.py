"""The held-out messy-inputs set (ops.generate.messy_set): deterministic, varied, unlike the
shipped regression set, loadable by `rollout verify`, and a CLI that fails clearly."""

import json
from collections import Counter

import pytest

from ops.generate import messy_set as messy
from ops.generate import regression_set as shipped
from rollout.settings import DEFAULT_LABELS, Settings
from serve.common.regression import DEFAULT_SET, load_set

KINDS = ("review", "social", "salad", "mixed-script", "code", "log", "short", "long", "shouting")


@pytest.fixture(scope="module")
def default_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("messy") / "messy.jsonl"
    assert messy.main(["--out", str(path)]) == 0
    return path


def test_same_seed_same_bytes_other_seed_differs(default_file, tmp_path):
    again, other = tmp_path / "again.jsonl", tmp_path / "other.jsonl"
    assert messy.main(["--out", str(again)]) == 0
    assert messy.main(["--out", str(other), "--seed", "7"]) == 0
    assert again.read_bytes() == default_file.read_bytes()
    assert other.read_bytes() != default_file.read_bytes()
    assert messy.SEED != shipped.SEED


def test_every_kind_is_present_in_its_share(default_file):
    rows = [json.loads(line) for line in default_file.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == messy.COUNT
    assert all(set(row) == {"text", "kind"} for row in rows)  # no labels
    kinds = Counter(row["kind"] for row in rows)
    assert tuple(kind for kind, _, _ in messy.KINDS) == KINDS
    assert kinds == {kind: share for kind, _, share in messy.KINDS}
    texts = [row["text"] for row in rows]
    assert len(set(texts)) == len(texts)
    assert all(text.strip() for text in texts)
    assert max(len(t) for t in texts) <= Settings.model_fields["max_item_chars"].default
    assert max(len(t.split()) for t in texts) > 300  # past the 256-token limit
    assert all(len(r["text"].split()) <= 3 for r in rows if r["kind"] == "short")
    mixed = [r["text"] for r in rows if r["kind"] == "mixed-script"]
    assert any(any("\u0400" <= ch <= "\u04ff" for ch in t) for t in mixed)  # Cyrillic
    assert any(any("\u0900" <= ch <= "\u097f" for ch in t) for t in mixed)  # Devanagari


def test_no_text_or_vocabulary_shared_with_the_shipped_set(default_file):
    ours = {t.strip().casefold() for t in load_set(default_file).texts}
    theirs = {t.strip().casefold() for t in load_set(DEFAULT_SET).texts}
    assert not ours & theirs
    assert not set(messy.SALAD + messy.SHORT) & set(shipped.WORDS)
    assert not set(messy.REVIEW_EMOJI) & set(shipped.EMOJI)
    foreign = "".join(s for sentences in shipped.FOREIGN.values() for s in sentences)
    assert not [f for fs in messy.FRAGMENTS.values() for f in fs if f in foreign]


def test_it_loads_as_a_regression_set(default_file):
    regression = load_set(default_file, DEFAULT_LABELS)
    assert len(regression) == messy.COUNT
    assert {e.label for e in regression.examples} == {None}
    assert set(Counter(e.meta["kind"] for e in regression.examples)) == set(KINDS)


@pytest.mark.parametrize("count", [1, 9, 10, 1201])
def test_any_count_is_honoured(count):
    quotas = messy.quotas(count)
    assert sum(quotas.values()) == count
    rows = messy.generate(count)
    assert len(rows) == count and Counter(r["kind"] for r in rows) == +Counter(quotas)


@pytest.mark.parametrize(("argv", "message"), [
    (["--count", "0"], "--count: must be at least 1, not 0"),
    (["--count", "-3"], "--count: must be at least 1"),
    (["--count", "many"], "--count: 'many' is not a whole number"),
    (["--seed", "x"], "--seed: invalid int value"),
    ([], "the following arguments are required: --out"),
])
def test_bad_arguments_are_clear_argparse_errors(tmp_path, capsys, argv, message):
    if argv:
        argv = ["--out", str(tmp_path / "x.jsonl"), *argv]
    with pytest.raises(SystemExit) as exit_:
        messy.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "x.jsonl").exists()


def test_a_missing_folder_is_a_clear_error(tmp_path, capsys):
    target = tmp_path / "nope" / "messy.jsonl"
    with pytest.raises(SystemExit) as exit_:
        messy.main(["--out", str(target)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"the folder {target.parent} does not exist" in err and "Traceback" not in err


def test_an_unwritable_path_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        messy.main(["--out", str(tmp_path)])  # a folder, not a file
    assert exit_.value.code == 2
    assert f"cannot write {tmp_path}: " in capsys.readouterr().err
