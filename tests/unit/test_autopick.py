"""`auto`'s choice by measurement (serve.recipes.auto.choose): candidates, pick, cache, and the
calibration measurement itself on a stub variant whose rows are crafted (no Ray, no Redis, no real
model)."""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

from rollout import FakeClock, Settings
from rollout.agreement import wilson_interval
from rollout.verdict import thresholds_from
from serve.common.regression import load_set
from serve.recipes.auto.choose import (
    Choice,
    Evidence,
    Hardware,
    cached_choice,
    candidates,
    choice_dir,
    choose,
    describe,
    detect_hardware,
    measure,
)
from serve.recipes.cpu_flags import bf16_native, cpu_flags
from tests.variant_settings import auto_groups

AVX2 = Hardware("cpu", bf16=False, flags=("avx2",))
SAPPHIRE = Hardware("cpu", bf16=True, flags=("avx2", "avx512f", "avx512_bf16", "amx_bf16"))
H100 = Hardware("cuda", bf16=True, name="NVIDIA H100", capability=(9, 0))
T4 = Hardware("cuda", bf16=False, name="Tesla T4", capability=(7, 5))
WEIGHTS = "a" * 64
LABELS = ("a", "b", "c")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch, tmp_path):
    """No CANARY_* from the machine leaks in; the default cache lies under the test's folder."""
    for name in list(os.environ):
        if name.upper().startswith("CANARY_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


@pytest.fixture
def settings(tmp_path):
    return Settings(auto_choice_dir=str(tmp_path / "auto"))


class StubMeasure:
    """`measure` stubbed: per recipe (passed, speedup), or an exception to raise; counts calls."""

    def __init__(self, results: dict):
        self.results = results
        self.calls: list[str] = []

    def __call__(self, baseline, recipe, texts, thresholds, *, truth=None, progress=None,
                 beaten_by=None):
        self.calls.append(recipe)
        assert len(texts) == 931 and len(truth) == 931  # the shipped set's validation split
        outcome = self.results[recipe]
        if isinstance(outcome, Exception):
            raise outcome
        passed, speedup = outcome
        return Evidence(recipe=recipe, passed=passed, speedup=speedup, agreement=0.989,
                        confident_flips=0 if passed else 2, n=len(texts),
                        failures=() if passed else ("2 confident flips (baseline margin >= "
                                                    "0.05) > 0",))


def pick(settings, hardware, results, **kw):
    stub = StubMeasure(results)
    choice = choose(*auto_groups(settings), SimpleNamespace(labels=settings.labels),
                    weights=WEIGHTS, device=hardware.device, measure=stub, hardware=hardware,
                    clock=FakeClock(), **kw)
    return choice, stub


# --- candidates ----------------------------------------------------------------------------------


def test_candidates_per_hardware():
    assert candidates(AVX2) == ("ov-int8", "ct2-int8", "onnx-fp32")
    assert candidates(SAPPHIRE) == ("bf16", "ov-int8", "ct2-int8", "onnx-fp32")
    assert candidates(SAPPHIRE, hide_native_bf16=True) == ("ov-int8", "ct2-int8", "onnx-fp32")
    assert candidates(H100) == ("fp16", "bf16", "fp16-graphs")
    assert candidates(T4) == ("fp16", "fp16-graphs")


def test_cpu_flags_come_from_every_processor_of_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nflags\t\t: fpu avx2 avx512f amx_int8 avx512_bf16\n\n"
        "processor\t: 1\nflags\t\t: fpu avx512_bf16 avx2 avx512f\n"
    )
    assert cpu_flags(cpuinfo.read_text()) == ("avx2", "avx512f", "avx512_bf16")
    assert detect_hardware("cpu", cpuinfo).flags == ("avx2", "avx512f", "avx512_bf16")
    assert detect_hardware("cpu", tmp_path / "missing").flags == ()


def test_bf16_is_native_only_where_cpuinfo_lists_avx512_bf16_or_amx(tmp_path):
    """oneDNN says yes wherever it can emulate bf16 (AVX512-BW without AVX512-BF16): the flags
    decide first, and without them bf16 is never taken as native."""
    import torch

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor : 0\nflags : avx2 avx512f avx512bw avx512_vnni\n")
    assert bf16_native(cpuinfo) is False
    assert bf16_native(tmp_path / "missing") is False  # unreadable: never assumed
    for flag in ("avx512_bf16", "amx_bf16"):
        cpuinfo.write_text(f"processor : 0\nflags : avx2 avx512f {flag}\n")
        assert bf16_native(cpuinfo) is bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())



# --- the pick ------------------------------------------------------------------------------------


def test_fastest_passing_candidate_wins(settings):
    choice, stub = pick(settings, AVX2, {"ov-int8": (True, 1.5), "ct2-int8": (True, 2.31),
                                        "onnx-fp32": (True, 1.2)})

    assert stub.calls == ["ov-int8", "ct2-int8", "onnx-fp32"]
    assert (choice.recipe, choice.fallback) == ("ct2-int8", False)
    assert [e.recipe for e in choice.evidence] == ["ov-int8", "ct2-int8", "onnx-fp32"]
    assert describe(choice) == ("auto → ct2-int8 (measured 2023-11-14: 2.31x, 98.9 % agreement, "
                                "0 confident flips; bf16 not native)")


def test_a_faster_failing_candidate_loses(settings):
    choice, _ = pick(settings, SAPPHIRE, {
        "bf16": (True, 1.9), "ov-int8": (False, 3.6), "ct2-int8": (False, 3.0),
        "onnx-fp32": (True, 1.1)})

    assert choice.recipe == "bf16" and not choice.fallback
    assert choice.evidence_for("ov-int8").passed is False


def test_a_near_tie_goes_to_the_preferred_candidate(settings):
    choice, _ = pick(settings, SAPPHIRE, {
        "bf16": (True, 1.94), "ov-int8": (True, 2.0), "ct2-int8": (True, 1.5),
        "onnx-fp32": (True, 1.1)})

    assert choice.recipe == "bf16"
    assert "within 5% of the fastest (ov-int8, 2.00x)" in choice.reason


@pytest.mark.parametrize(("hardware", "fallback"), [(AVX2, "onnx-fp32"), (H100, "fp32")])
def test_no_passing_candidate_falls_back_to_a_faithful_fp32_runtime(settings, hardware, fallback):
    results = dict.fromkeys(candidates(hardware), (False, 2.0))
    choice, _ = pick(settings, hardware, results)

    assert (choice.recipe, choice.fallback) == (fallback, True)
    assert choice.reason.startswith("no candidate passed the gate")
    assert all(f"{recipe}: 2 confident flips" in choice.reason for recipe in results)
    assert describe(choice).startswith(f"auto → {fallback} (fallback, measured 2023-11-14: no ")
    if hardware is H100:
        assert "fp8 not a candidate yet" in describe(choice)


def test_a_candidate_that_raises_is_recorded_not_fatal(settings):
    choice, stub = pick(settings, AVX2, {
        "ov-int8": ImportError("No module named 'openvino'\n(install it)"),
        "ct2-int8": ValueError("ct2-int8 serves encoders; this model is a sequence classifier"),
        "onnx-fp32": (True, 1.3)})

    assert stub.calls == ["ov-int8", "ct2-int8", "onnx-fp32"]
    assert choice.recipe == "onnx-fp32" and not choice.fallback
    failed = choice.evidence_for("ov-int8")
    assert failed.passed is False
    assert failed.error == "ImportError: No module named 'openvino' (install it)"


# --- the cache -----------------------------------------------------------------------------------


def test_a_cached_choice_is_served_without_measuring(settings):
    first, stub = pick(settings, AVX2, {"ct2-int8": (True, 2.0), "ov-int8": (True, 2.3),
                                        "onnx-fp32": (True, 1.2)})
    again, second = pick(settings, AVX2, {"ct2-int8": (True, 2.0), "ov-int8": (True, 2.3),
                                        "onnx-fp32": (True, 1.2)})

    assert len(stub.calls) == 3 and second.calls == []
    assert again == first
    assert cached_choice(*auto_groups(settings), weights=WEIGHTS, device="cpu",
                         hardware=AVX2) == first
    assert cached_choice(*auto_groups(settings), weights="b" * 64, device="cpu",
                         hardware=AVX2) is None


def _corrupt(name):
    def rewrite(file):
        doc = json.loads(file.read_text())
        if name == "not json":
            file.write_text('{"recipe": "onnx-int8", ')
        elif name == "other format":
            file.write_text(json.dumps({**doc, "format": 99}))
        elif name == "other key":
            file.write_text(json.dumps({**doc, "key": "0" * 16}))
        elif name == "recipe no candidate here":
            file.write_text(json.dumps({**doc, "recipe": "int8-dynamic"}))
        elif name == "unreadable":
            file.unlink()
            file.mkdir()
    return rewrite


@pytest.mark.parametrize("corruption", [
    "not json", "other format", "other key", "recipe no candidate here", "unreadable"])
def test_a_corrupt_or_stale_cached_choice_is_measured_again(settings, corruption):
    first, _ = pick(settings, AVX2, {"ct2-int8": (True, 2.0), "ov-int8": (True, 2.3),
                                        "onnx-fp32": (True, 1.2)})
    file = choice_dir(settings) / f"{first.key}.json"
    _corrupt(corruption)(file)

    assert cached_choice(*auto_groups(settings), weights=WEIGHTS, device="cpu",
                         hardware=AVX2) is None
    again, stub = pick(settings, AVX2, {"ct2-int8": (False, 2.0), "ov-int8": (False, 2.3),
                                        "onnx-fp32": (True, 1.2)})

    assert stub.calls == ["ov-int8", "ct2-int8", "onnx-fp32"]  # measured, not trusted
    assert again.recipe == "onnx-fp32"
    stored = cached_choice(*auto_groups(settings), weights=WEIGHTS, device="cpu", hardware=AVX2)
    assert stored == (None if corruption == "unreadable" else again)  # rewritten where it can be


def test_default_cache_folder_honours_xdg_cache_home(tmp_path):
    choice, _ = pick(Settings(), AVX2, {"ct2-int8": (True, 2.0), "ov-int8": (True, 2.3),
                                        "onnx-fp32": (True, 1.2)})

    assert (tmp_path / "xdg" / "canary-gateway" / "auto" / f"{choice.key}.json").is_file()


@pytest.mark.parametrize("change", [
    {"hide_native_bf16": True}, {"verify_min_agreement": 0.99}, {"verify_min_margin": 0.1},
    {"labels": ("x", "y")}, {"max_tokens": 128},
])
def test_key_follows_what_changes_the_choice(tmp_path, change):
    folder = str(tmp_path / "auto")
    before = Settings(auto_choice_dir=folder)
    after = Settings(auto_choice_dir=folder, **change)
    results = {"bf16": (True, 1.9), "ct2-int8": (True, 2.0), "ov-int8": (True, 2.3),
               "onnx-fp32": (True, 1.2)}
    first, _ = pick(before, SAPPHIRE, results)
    second, stub = pick(after, SAPPHIRE, results)

    assert second.key != first.key and stub.calls  # measured anew under the new key
    assert cached_choice(*auto_groups(before), weights=WEIGHTS, device="cpu",
                         hardware=SAPPHIRE) == first


def test_hidden_bf16_measures_the_int8_runtime_on_a_bf16_machine(tmp_path):
    hidden = Settings(auto_choice_dir=str(tmp_path), hide_native_bf16=True)
    choice, stub = pick(hidden, SAPPHIRE, {"ct2-int8": (True, 2.0), "ov-int8": (True, 2.3),
                                        "onnx-fp32": (True, 1.2)})

    assert "bf16" not in stub.calls  # hidden: not measured
    assert stub.calls == ["ov-int8", "ct2-int8", "onnx-fp32"] and choice.recipe == "ov-int8"
    assert choice.context["hardware"]["hide_native_bf16"] is True
    assert describe(choice).endswith("; native bf16 hidden (hide_native_bf16))")


# --- measure on a stub variant -------------------------------------------------------------------


def _unit(*values):
    return torch.nn.functional.normalize(torch.tensor(values), dim=-1)


OWN_DIMS = 8  # a stub row's dimensions beyond the label scores


@functools.lru_cache(maxsize=4096)
def _own(i: int) -> torch.Tensor:
    """Input i's own unit direction in the dimensions beyond the label scores."""
    own = torch.randn(OWN_DIMS, generator=torch.Generator().manual_seed(i))
    return own / own.norm()
NEAR_TIE = (0.70, 0.69, 0.10)  # baseline margin < 0.05 once normalised
CONFIDENT = (0.9, 0.3, 0.1)


def _swap_top_two(row):
    first, second = row[:len(LABELS)].topk(2).indices.tolist()
    row = row.clone()
    row[[first, second]] = row[[second, first]]
    return row


@dataclass
class Built:
    model: object
    decision: dict | None = None


@dataclass(frozen=True)
class StubModel:
    """A candidate: `cost` fake seconds per row, and which inputs it flips."""

    cost: float
    flips_near_ties: bool = False
    flips: tuple[int, ...] = ()  # inputs (by first-seen index) flipped whatever their margin
    tuned_on: frozenset[str] | None = None  # faithful on these texts only, flips the others


class StubVariant:
    """The fp32 variant's measuring interface: texts get an index when first seen; input i is a
    near tie when i % 100 == 1, else confident, its top label rotating with i. Scores are the
    rows themselves (unit vectors against an identity label matrix); every forward advances
    `clock` by the model's cost per row (fp32: 3.0)."""

    has_head = False
    labels = LABELS

    def __init__(self, builds: dict, clock: FakeClock, near_ties: frozenset[int] = frozenset()):
        self.builds, self.clock, self.index = builds, clock, {}
        self.near_ties = near_ties  # more near ties than i % 100 == 1

    def near_tie(self, i):
        return i % 100 == 1 or i in self.near_ties

    def build(self, recipe, progress=None):
        outcome = self.builds[recipe]
        if isinstance(outcome, Exception):
            raise outcome
        return Built(outcome, decision={"recipe": recipe})

    def _id(self, text):
        return self.index.setdefault(text, len(self.index))

    def encode(self, texts):
        return SimpleNamespace(ids=[[self._id(t)] * (1 + len(t) % 7) for t in texts])

    def base_row(self, i):
        """The label scores in the first three dimensions; a small direction of its own in
        the others, so that inputs have distinct nearest neighbours (serve.common.neighbours)."""
        values = NEAR_TIE if self.near_tie(i) else CONFIDENT
        row = torch.cat([_unit(*values).roll(i % 3), 0.1 * _own(i)])
        return row / row.norm()

    def row(self, i, model):
        row = self.base_row(i)
        if model is not None and (i in model.flips or (model.flips_near_ties and self.near_tie(i))
                                  or self._overfit(i, model)):
            return _swap_top_two(row)
        return row

    def _overfit(self, i, model):
        if model.tuned_on is None:
            return False
        text = next(text for text, index in self.index.items() if index == i)
        return text not in model.tuned_on

    def embed_batch(self, batch, model=None):
        ids = [row for item in batch for row in item.ids]
        self.clock.advance(len(ids) * (model.cost if model else 3.0))
        return [torch.stack([self.row(row[0], model) for row in ids])]

    def served(self, texts, model=None):  # one merged batch, as a replica forwards it
        return self.embed_batch([self.encode(texts)], model=model)[0]

    def rows(self, texts, batch_size=32, model=None):
        return torch.stack([self.row(self._id(t), model) for t in texts])

    def scores(self, rows):
        return rows[:, :len(LABELS)] @ torch.eye(len(LABELS)).T


def _measure(model, *, truth=None, n=200):
    clock = FakeClock(start=0.0)
    variant = StubVariant({"onnx-int8": model}, clock)
    texts = [f"input number {i}" + "!" * (i % 11) for i in range(n)]
    variant.index = {text: i for i, text in enumerate(texts)}  # input i is texts[i]
    return measure(variant, "onnx-int8", texts, thresholds_from(Settings()), truth=truth,
                   timer=clock.monotonic)


def test_measure_passes_near_tie_flips_within_the_bound():
    truth = [None if i % 100 == 1 else i % 3 for i in range(1000)]
    found = _measure(StubModel(cost=1.0, flips_near_ties=True), truth=truth, n=1000)

    assert (found.n, found.agreement, found.confident_flips) == (1000, 0.99, 0)
    assert found.lower_bound == pytest.approx(wilson_interval(990, 1000)[0])
    assert found.lower_bound > 0.98
    assert found.accuracy_drop == 0.0
    assert found.cosine_p1 == pytest.approx(0.9999, abs=1e-4)
    assert found.speedups == {8: 3.0, 32: 3.0} and found.speedup == 3.0
    assert found.passed and found.failures == () and not found.bound_only
    assert found.decision == {"recipe": "onnx-int8"}
    assert found.seconds > 0


def test_measure_refuses_what_only_the_bound_fails_as_verify_does():
    """198/200 agree with no confident flip: the point estimate passes 0.98, the Wilson lower
    bound does not, and verify's rule (the same function) refuses it on the same figures."""
    found = _measure(StubModel(cost=1.0, flips_near_ties=True))

    assert (found.n, found.agreement, found.confident_flips) == (200, 0.99, 0)
    assert found.lower_bound == pytest.approx(wilson_interval(198, 200)[0])
    assert found.lower_bound < 0.98
    assert found.failures == (f"agreement lower bound {found.lower_bound:.4f} < 0.98",)
    assert not found.passed and found.bound_only


def test_measure_fails_a_confident_flip_and_the_accuracy_it_costs():
    truth = [i % 3 for i in range(200)]  # the baseline's answers are right
    found = _measure(StubModel(cost=1.0, flips_near_ties=True, flips=(0,)), truth=truth)

    assert (found.agreement, found.confident_flips) == (0.985, 1)
    assert found.accuracy_drop == pytest.approx(3 / 200)
    assert found.failures == ("1 confident flips (baseline margin >= 0.05) > 0",
                              "accuracy drop 0.0150 > 0.01",
                              f"agreement lower bound {found.lower_bound:.4f} < 0.98")
    assert not found.passed and not found.bound_only


def test_measure_fails_a_candidate_no_faster_than_fp32_without_measuring_agreement():
    found = _measure(StubModel(cost=3.0))

    assert found.speedup == 1.0 and found.speedups == {8: 1.0, 32: 1.0}  # timed in full
    assert found.agreement is None and found.n == 0  # a candidate that cannot pass
    assert found.failures == ("speedup 1.00x: no faster than fp32",)


def test_a_candidate_far_too_slow_is_refused_on_its_screen():
    found = _measure(StubModel(cost=6.0))  # 0.5x: 0.5 x 1.25 < 1.0

    assert found.speedups == {32: 0.5} and found.speedup == 0.5  # one round, one size
    assert found.failures == ("speedup screened at 0.50x on 64 inputs: no faster than fp32",)
    assert found.agreement is None and not found.passed


def test_choose_with_real_measure_on_the_calibration_split(settings):
    settings = settings.model_copy(update={"verify_auto_margin": 0.0})  # verify's bars
    clock = FakeClock(start=0.0)
    variant = StubVariant({
        "bf16": StubModel(cost=1.0, flips=(0,)),  # fast, but flips a confident answer
        "ov-int8": RuntimeError("ov-int8 runs on CPU only"),
        "ct2-int8": StubModel(cost=3.0),  # faithful, but no faster than fp32
        "onnx-fp32": StubModel(cost=2.0, flips_near_ties=True),
    }, clock)
    choice = choose(*auto_groups(settings), variant, weights=WEIGHTS, device="cpu",
                    hardware=SAPPHIRE, measure=functools.partial(measure, timer=clock.monotonic),
                    clock=clock)

    assert (choice.recipe, choice.fallback) == ("onnx-fp32", False)
    assert choice.decision == {"recipe": "onnx-fp32"}
    bf16, int8, ct2, fp32 = choice.evidence
    assert bf16.confident_flips == 1 and not bf16.passed and bf16.speedup == 3.0
    assert ct2.recipe == "ct2-int8" and not ct2.passed and ct2.error is None
    assert ct2.failures == ("speedup 1.00x: no faster than fp32",)
    assert int8.error == "RuntimeError: ov-int8 runs on CPU only"
    assert fp32.n == 931 and fp32.passed and fp32.speedup == 1.5
    assert Choice.model_validate_json(choice.model_dump_json()) == choice


def test_a_candidate_tuned_to_the_calibration_split_is_refused_on_the_validation_split(
        settings):
    """Faithful on exactly the inputs it was tuned on, flipping every other: `auto` measures
    on the validation split, which no recipe tunes on, and refuses it."""
    regression = load_set()
    tuned = frozenset(regression.texts[i] for i in regression.calibration())
    clock = FakeClock(start=0.0)
    variant = StubVariant({
        "ov-int8": StubModel(cost=1.0, tuned_on=tuned),
        "ct2-int8": StubModel(cost=2.0),
        "onnx-fp32": StubModel(cost=2.5),
    }, clock)
    choice = choose(*auto_groups(settings), variant, weights=WEIGHTS, device="cpu",
                    hardware=AVX2, measure=functools.partial(measure, timer=clock.monotonic),
                    clock=clock)

    overfit = choice.evidence_for("ov-int8")
    assert overfit.agreement == 0.0 and not overfit.passed
    assert choice.recipe == "ct2-int8" and not choice.fallback
    slower = choice.evidence_for("onnx-fp32")  # measured after ct2-int8 passed, and slower
    assert slower.failures == ("cannot win: 1.20x, no faster than ct2-int8 (1.50x), which "
                               "passed and is preferred",)
    assert slower.agreement is None and slower.n == 0 and not slower.passed


def choose_near_tie_bf16(settings, progress=None):
    """`choose` with real `measure` where bf16 (fastest, preferred) flips 14 near ties of the
    931 validation inputs (98.5 %, Wilson lower bound 0.975) and the int8 runtimes and
    onnx-fp32 agree everywhere, each slower than the one before."""
    clock = FakeClock(start=0.0)
    variant = StubVariant({
        "bf16": StubModel(cost=0.5, flips_near_ties=True),
        "ov-int8": StubModel(cost=1.0),
        "ct2-int8": StubModel(cost=2.0),
        "onnx-fp32": StubModel(cost=2.5),
    }, clock, near_ties=frozenset(range(3, 50, 12)))
    return choose(*auto_groups(settings), variant, weights=WEIGHTS, device="cpu",
                  hardware=SAPPHIRE, measure=functools.partial(measure, timer=clock.monotonic),
                  clock=clock, progress=progress)


def test_a_candidate_whose_point_estimate_passes_and_bound_fails_is_not_served(settings):
    """bf16 (fastest, preferred) flips 14 near ties of the 931 validation inputs: 98.5 %
    agreement passes the 0.98 point bar, its Wilson lower bound (0.975) does not. verify would
    refuse it, so `auto` serves the next candidate that passes, and says why on the console
    and in `describe` (what `rollout status` shows)."""
    lines = []
    choice = choose_near_tie_bf16(settings.model_copy(update={"verify_auto_margin": 0.0}),
                                  progress=lambda line, _: lines.append(line))  # verify's bars

    bf16 = choice.evidence_for("bf16")
    assert bf16.n == 931 and bf16.confident_flips == 0 and 0.98 <= bf16.agreement < 0.99
    assert bf16.lower_bound < 0.98 and bf16.bound_only and not bf16.passed
    assert bf16.failures == (f"agreement lower bound {bf16.lower_bound:.4f} < 0.98",)
    assert (choice.recipe, choice.fallback) == ("ov-int8", False)
    assert any(line.startswith("auto: bf16 refused by the agreement bound alone (")
               for line in lines)
    assert f"; bf16 refused by the agreement bound alone ({bf16.agreement:.2%} agreement, " \
        f"95% lower bound {bf16.lower_bound:.4f} on 931 inputs)" in describe(choice)


def test_the_margin_refuses_a_candidate_at_verifys_bar_and_describe_names_the_closest_figure(
        settings):
    """bf16 flips near ties: 14 of 931 validation inputs (98.5 %, Wilson lower bound 0.975).
    With the margin off it passes bars of 0.97; with a margin of 0.01 the bars are 0.98 and
    `auto` refuses it, since verify on another split of the same size could read it below
    0.97. The served candidate's figure closest to its raised bar is named in `describe`."""
    def pick(margin: float):
        return choose_near_tie_bf16(settings.model_copy(update={
            "verify_auto_margin": margin, "verify_min_lower_bound": 0.97,
            "verify_min_agreement": 0.97}))

    assert pick(0.0).recipe == "bf16"
    raised = pick(0.01)
    bf16 = raised.evidence_for("bf16")
    assert not bf16.passed and bf16.failures[0].startswith("agreement lower bound ")
    assert bf16.failures[0].endswith(" < 0.98")
    assert raised.recipe == "ov-int8"
    served = raised.evidence_for("ov-int8")
    assert served.closest.startswith("agreement lower bound ") and "(bar 0.98)" in served.closest
    assert f"closest to its bar: {served.closest}" in describe(raised)
