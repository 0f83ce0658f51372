"""The answers' JSON (serve.common.json_body) and the rounded rows it is given
(serve.recipes.variants `rounded`)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from serve.common.json_body import JSONBody, dumps
from serve.recipes.variants import rounded


def test_the_body_reads_back_as_the_standard_encoder_wrote_it():
    body = {"request_id": "r-1", "label": "négatif ✓", "outputs": [
        {"embedding": [0.016190, -0.028821, 1e-07, 0.0, -1.5, 123456.0]},
        {"label": "a", "scores": {"a": 0.9, "b": 0.1}}], "fallback": False, "n": None,
        "big": 2 ** 53}
    encoded = dumps(body)
    assert json.loads(encoded) == body
    assert encoded == json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode(
    ).replace(b"1e-07", b"1e-7")
    response = JSONBody(body, headers={"X-Canary-Arm": "baseline"})
    assert response.body == encoded and response.media_type == "application/json"
    assert response.headers["content-length"] == str(len(encoded))


def test_numpy_arrays_are_written_as_lists():
    assert json.loads(dumps({"v": np.array([[0.5, -0.25]], dtype=np.float32)})) == {
        "v": [[0.5, -0.25]]}


def test_rows_are_rounded_to_six_decimals_as_python_rounds_them():
    rows = torch.nn.functional.normalize(torch.randn(64, 384, generator=torch.Generator()
                                                     .manual_seed(7)), dim=-1)
    expected = [[round(v, 6) for v in row] for row in rows.tolist()]
    assert rounded(rows) == expected
    assert all(len(repr(v).split(".")[-1]) <= 6 for v in rounded(rows)[0] if "e" not in repr(v))
    assert rounded(rows.to(torch.bfloat16)) == [[round(v, 6) for v in row]
                                                for row in rows.to(torch.bfloat16).tolist()]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_output_fails_instead_of_answering_null(bad):
    rows = torch.zeros(2, 4)
    rows[1, 2] = bad
    with pytest.raises(ValueError, match="non-finite"):
        rounded(rows)
