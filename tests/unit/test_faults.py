"""Fault injection (serve.replica.faults): parsed once from a replica's `user_config`, none unless
set, a misspelt or mistyped knob refused, and each fault changing only what it names."""

from __future__ import annotations

import pytest

from serve.recipes.source import Encoded
from serve.replica.faults import Faults, rotate_labels

CLASSIFIED = [{"label": "a", "scores": {"a": 0.7, "b": 0.2, "c": 0.1}}]


def test_no_fault_unless_set():
    faults = Faults.parse({"max_batch_size": 8})
    assert faults == Faults()
    assert not faults.out_of_memory([[1] * 512] * 64)
    assert faults.postprocess("classify", CLASSIFIED, None, None) == CLASSIFIED


def test_the_knobs_are_read_in_their_units():
    faults = Faults.parse({"fault_delay_ms": 250, "fault_error": True, "fault_oom_tokens": 100,
                           "fault_cpu_ms": "3", "fault_rotate_script": "han",
                           "fault_perturb_embeddings": 0.5})
    assert (faults.delay_s, faults.error, faults.oom_tokens, faults.cpu_s) == (0.25, True, 100,
                                                                               0.003)
    assert (faults.rotate_script, faults.perturb) == ("han", 0.5)
    assert faults.out_of_memory([[1] * 11] * 10) and not faults.out_of_memory([[1] * 10] * 10)


def test_a_misspelt_or_mistyped_knob_is_refused():
    with pytest.raises(ValueError, match=r"unknown fault injection setting\(s\) \['fault_eror'\]"):
        Faults.parse({"fault_eror": True})
    with pytest.raises(ValueError, match="fault injection: could not convert"):
        Faults.parse({"fault_delay_ms": "soon"})


def test_label_rotation_changes_every_top_label_and_only_classify_answers():
    (rotated,) = rotate_labels(CLASSIFIED)
    assert rotated["scores"] == {"a": 0.1, "b": 0.7, "c": 0.2} and rotated["label"] == "b"
    faults = Faults(rotate_labels=True)
    assert faults.postprocess("classify", CLASSIFIED, None, None)[0]["label"] == "b"
    embedded = [{"embedding": [1.0, 0.0]}]
    assert faults.postprocess("embed", embedded, None, None) == embedded


def test_perturbed_embeddings_stay_unit_vectors_and_move():
    embedded = [{"embedding": [1.0] + [0.0] * 15}]
    (moved,) = Faults(perturb=0.5).postprocess("embed", embedded, Encoded([[1, 2]]), None)
    norm = sum(x * x for x in moved["embedding"]) ** 0.5
    assert norm == pytest.approx(1.0, abs=1e-5) and moved["embedding"] != embedded[0]["embedding"]
