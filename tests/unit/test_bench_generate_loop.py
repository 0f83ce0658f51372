"""The decode loop's bench (ops.bench.generate_loop) on the small LM, at a tiny size: every way
answers the same requests with the same number of tokens, and each row carries its figures."""

from __future__ import annotations

import json

import pytest

from ops.bench import generate_loop


def test_every_way_answers_the_same_tokens_and_reports_its_figures(small_lm, tmp_path):
    lines = []
    rows = generate_loop.measure(small_lm, [1, 3], 6, lines.append, continuous=False)
    assert [(r["way"], r["concurrency"]) for r in rows] == [
        ("one at a time", 1), ("static batch", 1), ("decode loop", 1),
        ("one at a time", 3), ("static batch", 3), ("decode loop", 3)]
    wanted = sum(generate_loop.lengths(16, 6))
    for row in rows:
        assert row["tokens"] == wanted, row
        assert row["tokens_per_s"] > 0 and 0 < row["ttft_p50_ms"] <= row["ttft_p99_ms"]
        assert 0 < row["itl_p50_ms"] <= row["itl_p99_ms"]
    assert len(lines) == len(rows) and all("tokens/s" in line for line in lines)
    out = tmp_path / "rows.json"
    assert generate_loop.main(["--model", str(small_lm), "--concurrency", "1",
                               "--max-tokens", "3", "--json", str(out)]) == 0
    assert {row["way"] for row in json.loads(out.read_text())} >= {"decode loop", "static batch"}


def test_bad_arguments_are_refused_with_the_reason(small_lm, tmp_path, capsys):
    for argv, says in ((["--model", str(tmp_path)], "no config.json there"),
                       (["--model", str(small_lm), "--concurrency", "0"], "must be >= 1"),
                       (["--model", str(small_lm), "--concurrency", "a,b"], "whole numbers")):
        with pytest.raises(SystemExit) as done:
            generate_loop.main(argv)
        assert done.value.code == 2 and says in capsys.readouterr().err


def test_a_transformers_without_generate_batch_gets_a_row_that_says_so():
    cell = generate_loop.transformers_continuous(object(), [[1, 2]], [2], 2)
    assert cell.row()["tokens_per_s"] is None and cell.note == "not in this transformers"
