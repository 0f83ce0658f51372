"""`python -m ops.bench --plain`: the order of the cells, gateway ÷ plain per cell with each
side's refused share, its table, the request-size sweep and the options (no Ray, no Redis);
the plain deployment's body parsing and batch on the tiny encoder, outside Serve."""

from collections import Counter

import pytest

from ops.bench import __main__ as bench
from ops.bench import anchor, endtoend, report, target


def _level(concurrency: int, size: int, ok: int, failed: dict | None = None,
           window: float = 2.0) -> dict:
    samples = [(10.0, {}, None, "") for _ in range(ok)]
    return endtoend.summarize(samples, Counter(failed or {}), concurrency=concurrency,
                              window=window, per_request=size)


def _result(plain: list[dict], gateway: dict[str, list[dict]], sizes=(1,)) -> dict:
    meta = {"date": "2026-12-02 10:00 UTC", "hardware": "test", "model": "tiny",
            "inputs_per_request": sizes[0], "request_sizes": list(sizes), "max_batch_size": 16,
            "batch_wait_ms": 5.0, "replica_threads": 1, "inprocess_threads": None,
            "settings": {}, "mode": "local app", "ray_env": None,
            "plain": {"recipe": "fp32", "threads": 2, "route": "/plain"}}
    result = {"meta": meta, "memory": {}, "gateway": gateway, "plain": plain}
    result["summary"] = report.derive(result)
    return result


def test_without_plain_the_cells_go_arm_by_arm():
    assert target.order(["baseline", "optimized"], [1, 8], [1, 32]) == [
        ("baseline", 1, 1), ("baseline", 1, 32), ("baseline", 8, 1), ("baseline", 8, 32),
        ("optimized", 1, 1), ("optimized", 1, 32), ("optimized", 8, 1), ("optimized", 8, 32)]


def test_with_plain_each_cell_is_measured_on_plain_then_on_every_arm():
    assert target.order(["baseline", "optimized"], [1, 8], [4], plain=True) == [
        ("plain", 1, 4), ("baseline", 1, 4), ("optimized", 1, 4),
        ("plain", 8, 4), ("baseline", 8, 4), ("optimized", 8, 4)]


def test_the_load_generator_counts_what_it_sent():
    level = endtoend.summarize([], Counter({"503": 3}), concurrency=1, window=1.0,
                               per_request=8, sent=5)
    assert level["sent"] == 5 and level["inputs_per_request"] == 8
    # by default every request sent ended as an answer or a failure
    assert _level(1, 1, ok=7, failed={"503": 2, "lost:ReadTimeout": 1})["sent"] == 10
    assert _level(1, 1, ok=3)["arms"] == {}  # no X-Canary-Arm (plain Serve): no arm


def test_refused_share_is_every_request_not_answered_200_over_those_sent():
    assert anchor.refused_share(_level(8, 1, ok=6, failed={"503": 3, "lost:ConnectError": 1})
                                ) == pytest.approx(0.4)
    assert anchor.refused_share(_level(8, 1, ok=6)) == 0.0
    assert anchor.refused_share(_level(8, 1, ok=0)) is None  # nothing sent
    assert anchor.refused_share({"failed": {}, "concurrency": 1}) is None  # an older result


def test_gateway_over_plain_per_cell_and_arm():
    plain = [_level(1, 1, ok=20), _level(8, 1, ok=40), _level(8, 8, ok=10)]
    gateway = {
        "baseline": [_level(1, 1, ok=10), _level(8, 1, ok=60, failed={"503": 20}),
                     _level(8, 8, ok=0, failed={"503": 4})],
        "optimized": [_level(1, 1, ok=30)],  # not measured in the other cells
    }
    rows = _result(plain, gateway, sizes=(1, 8))["summary"]["versus_plain"]
    assert [(r["inputs_per_request"], r["concurrency"]) for r in rows] == [(1, 1), (1, 8), (8, 8)]
    assert rows[0]["plain"] == {"inputs_per_s": 10.0, "refused_share": 0.0}
    assert rows[0]["arms"]["baseline"]["ratio"] == pytest.approx(0.5)
    assert rows[0]["arms"]["optimized"]["ratio"] == pytest.approx(1.5)
    assert rows[1]["arms"]["baseline"] == {"inputs_per_s": 30.0, "refused_share": 0.25,
                                           "ratio": pytest.approx(1.5)}
    assert "optimized" not in rows[1]["arms"]
    # 8 texts per request: texts/s count every text; an arm that answered nothing has no ratio
    assert rows[2]["plain"]["inputs_per_s"] == pytest.approx(40.0)
    assert rows[2]["arms"]["baseline"] == {"inputs_per_s": 0.0, "refused_share": 1.0,
                                           "ratio": None}


def test_a_side_that_sent_nothing_in_the_window_was_not_measured():
    plain = [_level(8, 8, ok=0)]  # every request outlived the window: none sent in it
    rows = _result(plain, {"baseline": [_level(8, 8, ok=4)]})["summary"]["versus_plain"]
    assert rows[0]["plain"] == {"inputs_per_s": None, "refused_share": None}
    assert rows[0]["arms"]["baseline"]["ratio"] is None


def test_the_table_comes_last_with_sizes_ratios_and_refused_shares():
    plain = [_level(1, 1, ok=20), _level(8, 8, ok=10)]
    gateway = {"baseline": [_level(1, 1, ok=10), _level(8, 8, ok=20, failed={"503": 5})],
               "optimized": [_level(1, 1, ok=30), _level(8, 8, ok=0)]}
    table = report.markdown(_result(plain, gateway, sizes=(1, 8)))
    tail = table.rstrip("\n").split("\n")[-6:]
    assert tail[0] == ("| request size | conc. | plain texts/s | plain refused | baseline texts/s "
                       "| optimized texts/s | baseline refused | optimized refused "
                       "| baseline ÷ plain | optimized ÷ plain |")
    assert tail[2] == "| 1 | 1 | 10.0 | 0.0 % | 5.0 | 15.0 | 0.0 % | 0.0 % | 0.50× | 1.50× |"
    # the optimized arm sent nothing in the window of the second cell: not measured, not 0
    assert tail[3] == "| 8 | 8 | 40.0 | 0.0 % | 80.0 | – | 20.0 % | – | 2.00× | – |"
    assert tail[5].startswith("–: nothing sent in the measured window")
    # the detail table has a request-size column in a sweep, and the plain rows
    assert "| arm | conc. | texts/req | req/s |" in table
    assert "| plain | 8 | 8 | 5.0 | 40.0 |" in table
    assert "1, 8 inputs per request (the per-arm figures: 1)" in table


def test_a_run_without_plain_has_no_comparison():
    result = _result([], {"baseline": [_level(1, 1, ok=10)]})
    assert result["summary"]["versus_plain"] == []
    table = report.markdown(result)
    assert "÷ plain" not in table and "texts/req" not in table
    assert "1 input(s) per request" in table


def test_per_arm_figures_use_the_first_request_size():
    gateway = {arm: [_level(4, 1, ok=10), _level(4, 8, ok=10)]
               for arm in ("baseline", "optimized")}
    summary = _result([], gateway, sizes=(1, 8))["summary"]
    # 8-text requests carry 8x the texts/s; the first size's level is the saturation
    assert summary["arms"]["baseline"]["saturation"]["inputs_per_s"] == pytest.approx(5.0)


def test_options_sweep_request_sizes_and_take_plain():
    args = bench.parser().parse_args(["--inputs-per-request", "1,8", "--plain"])
    assert args.inputs_per_request == [1, 8] and args.plain
    args = bench.parser().parse_args(["--inputs-per-request", "4"])
    assert args.inputs_per_request == [4] and not args.plain
    assert bench.parser().parse_args([]).inputs_per_request == [1]


@pytest.mark.parametrize("argv", [
    ["--inputs-per-request", "0"], ["--inputs-per-request", "1,x"],
    ["--plain", "--url", "http://127.0.0.1:8000", "--yes"], ["--plain", "--no-gateway"],
])
def test_bad_plain_options_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(argv)
    assert exc.value.code == 2
    if "--plain" in argv:
        assert "--plain deploys beside the local app" in capsys.readouterr().err


@pytest.mark.parametrize("body, message", [
    (b"not json", "not JSON"), (b'{"inputs": []}', "`inputs`"),
    (b'{"inputs": ["a", " "]}', "`inputs`"), (b'["a"]', "`inputs`"),
    (b'{"inputs": ["a"], "task": "translate"}', "`task`"),
])
def test_the_plain_endpoint_refuses_what_the_gateway_refuses(body, message):
    from ops.bench import plain

    with pytest.raises(plain.BadRequest, match=message):
        plain.parse_body(body)


def test_the_plain_endpoint_takes_the_gateways_body():
    from ops.bench import plain

    assert plain.parse_body(b'{"inputs": ["a", "b"], "task": "embed"}') == (["a", "b"], "embed")
    assert plain.parse_body(b'{"inputs": ["a"]}', "classify") == (["a"], "classify")


def test_a_plain_batch_answers_each_text_as_the_baseline_variant_does(tmp_path):
    from ops.bench import plain
    from rollout.settings import Settings
    from serve.recipes.variants import Variant
    from tests.tiny_model import make_tiny_encoder
    from tests.variant_settings import groups

    settings = Settings(model_path=str(make_tiny_encoder(tmp_path / "enc")))
    server = object.__new__(plain.PlainModel.func_or_class)  # outside Serve: no __init__
    server.variant = Variant(groups(settings), "baseline", recipe=plain.RECIPE)
    items = [("a short text", "classify"),
             ("and a much longer one about sports and politics", "classify"),
             ("one more", "embed")]
    answers = server._infer(items)  # one batch of three texts, padded together
    assert len(answers) == 3
    for (text, task), got in zip(items, answers, strict=True):
        (alone,) = server.variant.postprocess(task, server.variant.rows([text]))
        if task == "classify":
            assert got["label"] == alone["label"]
            assert got["scores"] == pytest.approx(alone["scores"], abs=1e-4)
        else:
            assert got["embedding"] == pytest.approx(alone["embedding"], abs=1e-4)
