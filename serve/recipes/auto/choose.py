"""`auto`: the optimized recipe picked by measurement, once per weights, host and settings.

Algorithm (`choose`):

1. **Candidates** (`candidates`, pure), in order of preference:
   - CPU: `bf16` where the CPU computes bf16 natively (AVX512-BF16 or AMX) and the setting
     `hide_native_bf16` is off, then `ov-int8` (OpenVINO int8 by NNCF, calibrated,
     serve.recipes.ov_int8), `ct2-int8` (CTranslate2 int8, serve.recipes.ct2_int8), then
     `onnx-fp32`. `onnx-int8` (ONNX Runtime int8, serve.recipes.onnx) is a recipe to pin, not a
     candidate: it was the slowest int8 runtime on both CPUs measured (docs/recipes.md) and the
     slowest to build;
   - CUDA: `fp16`, `bf16` where the GPU supports it, `fp16-graphs`. fp8 (Hopper, capability
     8.9 and up) is not a candidate yet: no fp8 recipe exists.
2. **Measure** each against the fp32 baseline on the regression set's *validation* split
   (`measure`, serve.recipes.auto.trial): inputs no recipe tuned on (a calibrated recipe tunes on
   the calibration split, serve.common.regression), so a candidate that only fits the inputs it was
   tuned on is refused here, not served: verify's own rule (rollout.verdict.judge_comparison,
   the Wilson lower bound, the slices and retrieval included) on a split as large as verify's,
   each bar raised by `verify_auto_margin` (rollout.verdict.auto_thresholds: the spread measured
   between the two splits), so the recipe served is one `rollout verify` passes, and a speedup
   on served batches that must beat fp32. The served candidate's figure closest to its bar is
   named in `describe`. A candidate refused by the lower bound alone says so, on the console and in
   `describe` (the startup log, `rollout status`). A candidate that raises while being built or
   measured (a missing runtime, "runs on CUDA only") is recorded as failed with its error; it
   never fails the pick.
3. **Pick.** Among the passing candidates, the fastest wins (so a candidate no faster than an
   earlier one that passed cannot win: step 2 skips its agreement); one within TIE of the fastest
   counts as tied with it, and of tied ones the earlier in preference order wins (the timing
   noise of a shared machine is about that large). No candidate passing: the fallback, a
   faithful fp32 runtime (`onnx-fp32` on CPU, `fp32` on CUDA), with `fallback=True` and the
   reason, never an unfaithful recipe.
4. **Cache.** The choice, with the evidence of every candidate, is one JSON file named by a key
   that hashes everything that could change it: the format, the weights, the hardware (CPU:
   the CPU_FLAGS that /proc/cpuinfo lists, native bf16 and `hide_native_bf16`; CUDA: the
   device's name, capability and bf16 support), the versions of torch, transformers and the
   runtimes (onnxruntime, ctranslate2, openvino, nncf), the regression set, the settings that
   change answers (ANSWER_SETTINGS) and the gate's thresholds. A file is written atomically
   (temporary file + replace). A file that cannot be read, is not a choice of this FORMAT,
   names another key, or names a recipe that is neither a candidate here nor the fallback is
   ignored and the choice measured again: a cached choice is never trusted beyond its key.
   Replicas starting together on one host measure once: a lock file serializes them, and the
   later ones find the stored choice.

The recipe's torch thread count is not in the key: `rollout verify` (all cores) and a replica
(its share) must agree on the choice, or verify would judge another version than is served.
An operator pins a recipe with `CANARY_OPTIMIZED_RECIPE=<name>`; this module decides only
`auto`, and only for the optimized arm. What it compares: each candidate against fp32 of the
optimized arm's *own* weights (`CANARY_OPTIMIZED_MODEL_PATH`), never against the baseline arm,
which may be other weights: it picks the fastest faithful way to run those weights. Whether the
new weights agree with the baseline's is `rollout verify`'s question, on both configured arms.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rollout.clock import Clock, SystemClock
from rollout.settings import ModelSettings, RecipeSettings, VerifySettings
from rollout.verdict import auto_thresholds
from serve.common.regression import load_set
from serve.recipes.artifact import cache_root
from serve.recipes.auto.trial import Evidence, measure
from serve.recipes.cpu_flags import bf16_native, cpu_flags, read_cpu_flags

log = logging.getLogger("canary.autopick")

FORMAT = 4  # 4: verify's rule with a margin, ties in retrieval (3: verify's rule, bound
# included, on the 3/8 validation split; 2: without the bound on 1/8; 1: on the calibration
# split)
TIE = 0.05  # speedups within 5 % of the fastest count as tied
FALLBACK = {"cpu": "onnx-fp32", "cuda": "fp32"}
ANSWER_SETTINGS = {"labels", "label_template", "max_tokens", "int8_target_agreement"}

__all__ = [
    "Choice", "Evidence", "Hardware", "cached_choice", "candidates", "choice_dir", "choose",
    "cpu_flags", "describe", "detect_hardware", "measure", "read_cpu_flags",
]


@dataclass(frozen=True)
class Hardware:
    """What decides which recipes apply and how fast they run."""

    device: str  # "cpu" or "cuda"
    bf16: bool  # CPU: native bf16 matmuls (cpu_flags.bf16_native); CUDA: bf16 supported
    flags: tuple[str, ...] = ()  # CPU: the CPU_FLAGS /proc/cpuinfo lists
    name: str = ""  # CUDA: the device's name
    capability: tuple[int, int] | None = None  # CUDA: compute capability

    def key(self, hide_native_bf16: bool) -> dict:
        if self.device == "cuda":
            return {"device": "cuda", "name": self.name, "capability": list(self.capability or ()),
                    "bf16": self.bf16}
        return {"device": "cpu", "machine": platform.machine(), "flags": list(self.flags),
                "bf16": self.bf16, "hide_native_bf16": hide_native_bf16}


def detect_hardware(device: str, cpuinfo: Path = Path("/proc/cpuinfo")) -> Hardware:
    """This machine's Hardware for `device` (CPU flags read from `cpuinfo`, never assumed)."""
    if device == "cuda":
        import torch

        return Hardware("cuda", bool(torch.cuda.is_bf16_supported()),
                        name=torch.cuda.get_device_name(),
                        capability=tuple(torch.cuda.get_device_capability()))
    return Hardware("cpu", bf16_native(cpuinfo), read_cpu_flags(cpuinfo))


def candidates(hardware: Hardware, *, hide_native_bf16: bool = False) -> tuple[str, ...]:
    """The recipes `auto` measures on `hardware`, in order of preference (module docstring)."""
    if hardware.device == "cuda":
        return ("fp16", "bf16", "fp16-graphs") if hardware.bf16 else ("fp16", "fp16-graphs")
    int8 = ("ov-int8", "ct2-int8", "onnx-fp32")
    return ("bf16", *int8) if hardware.bf16 and not hide_native_bf16 else int8


def _notes(hardware: Hardware, hide_native_bf16: bool) -> tuple[str, ...]:
    """Why a recipe one might expect is not a candidate here."""
    if hardware.device == "cuda":
        notes = () if hardware.bf16 else ("bf16 not supported",)
        if hardware.capability and hardware.capability >= (8, 9):
            notes += ("fp8 not a candidate yet",)
        return notes
    if not hardware.bf16:
        return ("bf16 not native",)
    return ("native bf16 hidden (hide_native_bf16)",) if hide_native_bf16 else ()


class Choice(BaseModel):
    """What `auto` serves here, and the evidence it was chosen on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: int
    key: str
    recipe: str
    decision: dict | None = None  # what the recipe's version hashes (Built.decision), if any
    fallback: bool = False  # no candidate passed: `recipe` is the faithful fp32 runtime
    reason: str
    notes: tuple[str, ...] = ()
    evidence: tuple[Evidence, ...] = ()  # one per candidate, in order of preference
    at: float  # when it was measured (epoch seconds)
    context: dict = Field(default_factory=dict)  # what the key hashes, for people

    def evidence_for(self, recipe: str) -> Evidence | None:
        return next((e for e in self.evidence if e.recipe == recipe), None)


def choose(model: ModelSettings, recipe: RecipeSettings, verify: VerifySettings, baseline, *,
           weights: str, device: str, measure=measure, progress=None,
           hardware: Hardware | None = None, clock: Clock | None = None) -> Choice:
    """The cached choice for these weights, host and settings, or one measured now and cached.
    `baseline` is the fp32 `serve.recipes.variants.Variant`, whose model must still be fp32."""
    hardware = hardware or detect_hardware(device)
    key, context = choice_key(model, recipe, verify, weights=weights, hardware=hardware,
                              labels=baseline.labels)
    return cached(choice_dir(recipe), key, _allowed(recipe, hardware), lambda: _measure_all(
        recipe, verify, baseline, hardware, measure, progress, clock or SystemClock(), key=key,
        context=context))


def cached(folder: Path, key: str, allowed: set[str], measure_all: Callable[[], Choice]
           ) -> Choice:
    """The choice stored under `key` in `folder` if it can be trusted (module docstring, step
    4), else `measure_all()`, stored: replicas on one host measure once."""
    if (found := _read(folder, key, allowed)) is not None:
        return found
    with _claim(folder, key):
        if (found := _read(folder, key, allowed)) is not None:  # measured while we waited
            return found
        choice = measure_all()
        _store(folder, choice)
    return choice


def cached_choice(model: ModelSettings, recipe: RecipeSettings, verify: VerifySettings, *,
                  weights: str, device: str, hardware: Hardware | None = None,
                  labels: tuple[str, ...] | None = None) -> Choice | None:
    """The stored choice for these weights, host and settings, without measuring; None when
    there is none (or none to trust). `labels`: the arm's (serve.recipes.variants.arm_labels), when
    its folder declares its own."""
    hardware = hardware or detect_hardware(device)
    key, _ = choice_key(model, recipe, verify, weights=weights, hardware=hardware, labels=labels)
    return _read(choice_dir(recipe), key, _allowed(recipe, hardware))


def describe(choice: Choice) -> str:
    """One line for the startup log and `rollout status`, e.g. 'auto → onnx-int8 (measured
    2026-11-30: 2.31x, 98.9 % agreement, 0 confident flips; bf16 not native)'."""
    day = time.strftime("%Y-%m-%d", time.gmtime(choice.at))
    notes = "".join(f"; {note}" for note in choice.notes)
    notes += "".join(f"; {_bound_refusal(e)}" for e in choice.evidence if e.bound_only)
    found = choice.evidence_for(choice.recipe)
    if choice.fallback:
        return f"auto → {choice.recipe} (fallback, measured {day}: {choice.reason}{notes})"
    closest = f"; closest to its bar: {found.closest}" if found.closest else ""
    return f"auto → {choice.recipe} (measured {day}: {_figures(found)}{closest}{notes})"


def _figures(found: Evidence) -> str:
    """A passing candidate's speedup and fidelity in a few words: a causal LM's by its tokens
    (serve.recipes.auto.causal), an encoder's by its answers."""
    if found.kld is not None:
        return (f"{found.speedup:.2f}x, KL divergence {found.kld:.5f} nats, "
                f"{found.agreement * 100:.1f} % top-1 token agreement")
    return (f"{found.speedup:.2f}x, {found.agreement * 100:.1f} % agreement, "
            f"{found.confident_flips} confident flips")


def _bound_refusal(found: Evidence) -> str:
    """Why a candidate whose point estimates pass was refused, in a few words."""
    return (f"{found.recipe} refused by the agreement bound alone ({found.agreement:.2%} "
            f"agreement, 95% lower bound {found.lower_bound:.4f} on {found.n} inputs)")


def choice_key(model: ModelSettings, recipe: RecipeSettings, verify: VerifySettings, *,
               weights: str, hardware: Hardware, labels: tuple[str, ...] | None = None,
               extra: dict | None = None) -> tuple[str, dict]:
    """(key, the parts it hashes): module docstring, step 4. `labels`: the arm's, in place of
    `model.labels` (the same key when they are equal). The answer settings of both groups are
    hashed as one mapping, so the key does not depend on which group holds a field. `extra`:
    more parts (a causal LM's task and measurement settings)."""
    answers = {**model.model_dump(mode="json", include=ANSWER_SETTINGS),
               **recipe.model_dump(mode="json", include=ANSWER_SETTINGS)}
    if labels is not None:
        answers["labels"] = list(labels)
    context = {
        "format": FORMAT, "weights": weights,
        "hardware": hardware.key(recipe.hide_native_bf16),
        "versions": library_versions(),
        "set": load_set(verify.regression_set).digest,
        "settings": answers,
        "thresholds": auto_thresholds(verify).model_dump(mode="json"),
        **(extra or {}),
    }
    text = json.dumps(context, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16], context


def library_versions() -> dict[str, str | None]:
    import torch
    import transformers

    found = {"torch": torch.__version__, "transformers": transformers.__version__}
    for runtime in ("onnxruntime", "ctranslate2", "openvino", "nncf"):
        try:  # the installed distribution's version: nothing is imported
            found[runtime] = metadata.version(runtime)
        except metadata.PackageNotFoundError:
            found[runtime] = None
    return found


def default_choice_dir() -> Path:
    return cache_root() / "auto"


def choice_dir(settings: RecipeSettings) -> Path:
    if settings.auto_choice_dir:
        return Path(settings.auto_choice_dir).expanduser()
    return default_choice_dir()


def _allowed(settings: RecipeSettings, hardware: Hardware) -> set[str]:
    """The recipes a choice for this host may name."""
    return {*candidates(hardware, hide_native_bf16=settings.hide_native_bf16),
            FALLBACK[hardware.device]}


def _measure_all(recipe: RecipeSettings, verify: VerifySettings, baseline, hardware: Hardware,
                 measure, progress, clock: Clock, *, key: str, context: dict) -> Choice:
    """Steps 2 and 3: measure every candidate on the validation split, then pick."""
    regression = load_set(verify.regression_set)
    examples = [regression.examples[i] for i in regression.validation()]
    index = {label: i for i, label in enumerate(baseline.labels)}
    texts = [example.text for example in examples]
    truth = [index.get(example.label) if example.label else None for example in examples]
    thresholds = auto_thresholds(verify)
    log.info("auto: measuring on %d validation inputs", len(texts))
    evidence = measure_each(
        candidates(hardware, hide_native_bf16=recipe.hide_native_bf16),
        lambda name, beaten_by: measure(baseline, name, texts, thresholds, truth=truth,
                                        progress=progress, beaten_by=beaten_by),
        progress, clock)
    return pick(evidence, hardware, recipe.hide_native_bf16, fallback=FALLBACK[hardware.device],
                key=key, context=context, at=clock.time())


def measure_each(names: tuple[str, ...],
                 measure_one: Callable[[str, tuple[str, float] | None], Evidence], progress,
                 clock: Clock) -> tuple[Evidence, ...]:
    """Step 2 for each candidate in order of preference: `measure_one(name, beaten_by)`, where
    `beaten_by` is the fastest earlier candidate that passed (recipe, speedup); a candidate that
    raises is recorded as failed with its error. Each is logged as it is measured."""
    evidence = []
    for name in names:
        log.info("auto: measuring %s", name)
        if progress is not None:
            progress(f"auto: measuring {name}", None)
        start = clock.monotonic()
        passed = [e for e in evidence if e.passed]
        best = max(passed, key=lambda e: e.speedup) if passed else None
        try:
            found = measure_one(name, (best.recipe, best.speedup) if best else None)
        except Exception as exc:  # a candidate that cannot run here is a failed candidate
            log.warning("auto: %s failed: %s", name, exc)
            found = Evidence.failed(name, exc, clock.monotonic() - start)
        _log_evidence(found, progress)
        evidence.append(found)
    return tuple(evidence)


def _log_evidence(found: Evidence, progress) -> None:
    """One line per measured candidate, as it is measured: the startup log and the console."""
    if found.passed:
        closest = f"; closest to its bar: {found.closest}" if found.closest else ""
        line = (f"auto: {found.recipe} passed: {_figures(found)}{closest} "
                f"({found.seconds:.0f} s)")
    elif found.bound_only:
        line = (f"auto: {_bound_refusal(found)}: {found.failures[0]}; verify would refuse it "
                f"too ({found.seconds:.0f} s)")
    else:
        reason = found.failures[0] if found.failures else "failed"
        line = f"auto: {found.recipe} refused: {reason} ({found.seconds:.0f} s)"
    log.info("%s", line)
    if progress is not None:
        progress(line, None)


def pick(evidence: tuple[Evidence, ...], hardware: Hardware, hide_native_bf16: bool, *,
         fallback: str, key: str, context: dict, at: float) -> Choice:
    """Step 3 over evidence in order of preference; `fallback`: the faithful recipe served when
    none passes."""
    common = {"format": FORMAT, "key": key, "evidence": evidence, "at": at, "context": context,
              "notes": _notes(hardware, hide_native_bf16)}
    passing = [e for e in evidence if e.passed]
    if not passing:
        recipe = fallback
        found = next((e for e in evidence if e.recipe == recipe), None)
        failed = "; ".join(f"{e.recipe}: {e.failures[0] if e.failures else 'failed'}"
                           for e in evidence)
        return Choice(recipe=recipe, decision=found.decision if found else None, fallback=True,
                      reason=f"no candidate passed the gate ({failed or 'none applies'})",
                      **common)
    fastest = max(passing, key=lambda e: e.speedup)
    winner = next(e for e in passing if e.speedup >= fastest.speedup / (1 + TIE))
    reason = f"fastest of {len(passing)} passing candidates ({winner.speedup:.2f}x)"
    if winner is not fastest:
        reason = (f"within {TIE:.0%} of the fastest ({fastest.recipe}, "
                  f"{fastest.speedup:.2f}x) and preferred to it")
    return Choice(recipe=winner.recipe, decision=winner.decision, reason=reason, **common)


def _read(folder: Path, key: str, allowed: set[str]) -> Choice | None:
    """The stored choice under `key`, if it can be trusted (module docstring, step 4)."""
    file = folder / f"{key}.json"
    try:
        text = file.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        log.warning("auto: ignoring unreadable %s: %s", file, exc)
        return None
    try:
        choice = Choice.model_validate_json(text)
    except ValidationError as exc:
        log.warning("auto: ignoring %s, not a choice: %s", file, exc.errors()[0]["msg"])
        return None
    if choice.format != FORMAT or choice.key != key or choice.recipe not in allowed:
        log.warning("auto: ignoring %s: format %s, key %s, recipe %s do not fit this host",
                    file, choice.format, choice.key, choice.recipe)
        return None
    return choice


def _store(folder: Path, choice: Choice) -> None:
    """Write atomically: a replica never reads half a choice. Failing to write is logged, not
    raised: the choice stands, it is measured again next start."""
    file = folder / f"{choice.key}.json"
    tmp = file.with_suffix(f".tmp{os.getpid()}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp.write_text(choice.model_dump_json(indent=1) + "\n")
        tmp.replace(file)
    except OSError as exc:
        log.warning("auto: could not cache the choice in %s: %s", file, exc)
        with contextlib.suppress(OSError):
            tmp.unlink()


@contextlib.contextmanager
def _claim(folder: Path, key: str):
    """Hold the key's lock file while measuring, so replicas on one host measure once (without
    a writable folder: no lock, each measures)."""
    import fcntl

    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle = open(folder / f"{key}.lock", "a")  # closed below, which releases the lock
    except OSError:
        yield
        return
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        handle.close()  # releases the lock
