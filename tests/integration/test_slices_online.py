"""Per-slice online agreement on the real Serve app: a canary that flips
every Chinese input while agreeing on about 98 % of all inputs is rolled back by the ramp's
`worst_slice_agreement` gate, where the overall agreement gate passes or waits; and the slice
of CANARY_SLICE_HEADER, capped in number and length of values. And online retrieval
compatibility: a canary whose embeddings drift shows its recall@10 falling in `rollout status`
and is rolled back by the ramp's `min_recall_at_10` gate."""

from __future__ import annotations

import io
import time

import pytest

from ops.cli import main
from rollout.ramp import CONTROLLER, parse_plan
from tests.integration.test_gateway_telemetry import scrape
from tests.integration.test_ramp_gateway import wait_for
from tests.integration.test_shadow import shadow_stats
from tests.verdicts import passing_verdict

LATIN = ["the match went to extra time", "parliament passed the budget", "rain is expected",
         "the striker scored twice", "shares fell sharply", "a new vaccine was approved",
         "the team won the cup"]
CJK = "中国队的比赛"  # characters the tiny model's vocabulary knows (the fault decodes ids)


@pytest.fixture
def ramp_env(gw):
    control = gw.ramp_control()
    [(baseline, optimized)] = list(control.rollout.live_versions())
    control.states.put_verdict(passing_verdict(baseline, optimized))
    yield control
    ramp = control.ramps.get()
    if ramp is not None and ramp.active:
        control.abort(actor="test", reason="test cleanup")
    gw.redeploy({})
    gw.set_state(canary_bp=0)
    control.states.close()
    control.ramps.close()


def test_a_canary_that_breaks_one_script_is_rolled_back_by_the_slice_gate(gw, ramp_env):
    gw.redeploy({"optimized": {"fault_rotate_script": "han"}}, shadow_share=1.0)
    plan = parse_plan({"window_s": 30, "gates": {
        "min_samples": 3, "agreement_lower_bound": 0.95, "min_agreement_pairs": 50,
        "worst_slice_agreement": 0.9, "min_slice_pairs": 20},
        "steps": [{"percent": 50, "min_duration_s": 600, "min_samples": 3}, {"percent": 100}]})
    since = time.time()
    ramp_env.start(plan, actor="test", reason="one broken script")
    wait_for(lambda: gw.served_state()["effective_percent"] == 50, 30, "the 50 % step")
    before = shadow_stats(gw)
    for i in range(400):  # 8 inputs a request, one Chinese input in every 7th: 1.8 %
        inputs = [LATIN[(i + j) % len(LATIN)] for j in range(8)]
        if i % 7 == 0:
            inputs[i % 8] = CJK
        assert gw.predict(inputs).status_code == 200
        if ramp_env.ramps.get().status != "running":
            break
    ramp = wait_for(lambda: (r := ramp_env.ramps.get()).status != "running" and r, 30,
                    "the rollback")
    assert ramp.status == "aborted" and "worst_slice_agreement" in ramp.reason, ramp.reason
    failing = [e for e in ramp_env.states.audit() if e.actor == CONTROLLER and e.ts >= since
               and any(g["status"] == "fail" for g in (e.detail or {}).get("gates", []))][0]
    gates = {g["name"]: g for g in failing.detail["gates"]}
    assert gates["worst_slice_agreement"]["status"] == "fail"
    assert "script:han" in gates["worst_slice_agreement"]["note"]
    assert gates["agreement_lower_bound"]["status"] in ("pass", "wait")
    stats = shadow_stats(gw)
    pairs, agreed = stats.pairs - before.pairs, stats.agreed - before.agreed
    # this test's pairs only: earlier tests' shadow pairs are in the same window
    han, latin = (tuple(now - then for now, then in zip(
        stats.slices[key], before.slices.get(key, (0, 0, 0)), strict=True))
        for key in ("script:han", "script:latin"))
    assert pairs and agreed / pairs >= 0.98, (agreed, pairs)
    assert han[0] >= 20 and han[1] == 0, han  # every Chinese input flipped
    assert latin[0] > 10 * han[0] and latin[1] >= 0.99 * latin[0], latin
    assert ramp_env.states.get().canary_bp == 0
    print(f"\nscript:han {han}, script:latin {latin}; overall {agreed}/{pairs}; "
          f"gates: {gates['worst_slice_agreement']['note']} | "
          f"{gates['agreement_lower_bound']['status']}: {gates['agreement_lower_bound']['note']}")


def test_the_slice_header_is_counted_and_capped(gw):
    gw.redeploy({}, shadow_share=1.0, slice_header="X-Tenant")

    def probed():  # until the new gateway replica answers (one value: "probe")
        assert gw.predict(["the team won the cup"], **{"X-Tenant": "probe"}).status_code == 200
        return shadow_stats(gw).slices.get("header:probe")

    wait_for(probed, 30, "a gateway that counts the header")
    tenants = ["acme", "y" * 300, *(f"tenant-{i}" for i in range(40))]
    for tenant in tenants:
        assert gw.predict(["the team won the cup"], **{"X-Tenant": tenant}).status_code == 200
    others = len(tenants) + 1 - 32  # "probe" holds one of the 32 values
    try:
        stats = wait_for(lambda: (s := shadow_stats(gw)).slices.get("header:other", (0,))[0]
                         >= others and s, 20, "the header slices")
    except AssertionError:
        raise AssertionError(shadow_stats(gw).slices) from None
    headers = {key: cell for key, cell in stats.slices.items() if key.startswith("header:")}
    assert headers["header:acme"][0] == 1
    assert headers["header:" + "y" * 64][0] == 1 and ("header:" + "y" * 65) not in headers
    assert len(headers) == 33 and headers["header:other"][0] == others
    assert stats.slices["script:latin"][0] >= len(tenants)


def embed_requests(gw, first: int, count: int, ramp_env=None) -> None:
    """`count` embed requests of 8 distinct texts each; stops early once a ramp has ended."""
    for i in range(first, first + count):
        texts = [f"report {i} item {j}: the match went to extra time" for j in range(8)]
        response = gw.client.post("/v1/predict", json={"inputs": texts, "task": "embed"})
        assert response.status_code == 200, response.text
        if ramp_env is not None and ramp_env.ramps.get().status != "running":
            return


def recall_since(gw, before, pairs: int):
    """(embed pairs compared in the reservoir since `before`, their recall@10), once at least
    `pairs` of them reached Redis."""
    stats = wait_for(lambda: (s := shadow_stats(gw)).recall_queries - before.recall_queries
                     >= pairs and s, 30, f"{pairs} embed pairs compared in the reservoir")
    queries = stats.recall_queries - before.recall_queries
    return stats, queries, (stats.recall_hits - before.recall_hits) / (10 * queries)


def embed_until_compared(gw, before, pairs: int):
    """Embed requests until `pairs` more embed pairs were compared in the reservoir (on a
    loaded machine some shadow calls time out or are shed): as `recall_since`."""
    deadline, first = time.monotonic() + 90, 0
    while (shadow_stats(gw).recall_queries - before.recall_queries < pairs
           and time.monotonic() < deadline):
        embed_requests(gw, first, 2)
        first += 2
        time.sleep(0.2)
    return recall_since(gw, before, pairs)


def recall_histogram(samples: dict) -> tuple[float, float]:
    """(count, sum) of canary_shadow_recall_at_10 over both shadowed arms, from `scrape`."""
    return tuple(sum(value for (name, _), value in samples.items()
                     if name == f"canary_shadow_recall_at_10_{part}") for part in ("count", "sum"))


def status_recall(gw, monkeypatch, window_s: int = 60) -> tuple[float, int]:
    """The online recall@10 `rollout status --window window_s` shows (its shadow section's
    line), and the embed pairs it counts."""
    monkeypatch.setenv("REDIS_URL", gw.redis.url)
    monkeypatch.setenv("CANARY_APP_NAME", gw.settings.app_name)
    out, err = io.StringIO(), io.StringIO()
    assert main(["status", "--window", str(window_s)], stdout=out, stderr=err) == 0, \
        err.getvalue()
    line = next(line for line in out.getvalue().splitlines()
                if line.startswith("  recall@10 "))
    pairs = line.split("(n=", 1)[1].split(" ", 1)[0].replace(",", "")
    return float(line.split()[1].rstrip("%")) / 100, int(pairs)


def test_a_canary_whose_vectors_drift_loses_recall_and_is_rolled_back(gw, ramp_env,
                                                                       monkeypatch):
    gw.redeploy({}, shadow_share=1.0)
    healthy, _, recall = embed_until_compared(gw, shadow_stats(gw), 40)
    assert recall >= 0.9, recall  # the same weights on both arms keep their neighbours
    shown, _ = status_recall(gw, monkeypatch)

    gw.redeploy({"optimized": {"fault_perturb_embeddings": 1.0}}, shadow_share=1.0)
    # from here only the perturbed arm's pairs count (a healthy pair compared late would lift
    # the drifted recall)
    perturbed, since = shadow_stats(gw), time.time()
    plan = parse_plan({"window_s": 30, "gates": {
        "min_samples": 3, "min_recall_at_10": 0.95, "min_agreement_pairs": 50},
        "steps": [{"percent": 50, "min_duration_s": 600, "min_samples": 3}, {"percent": 100}]})
    scraped = recall_histogram(scrape(gw))
    ramp_env.start(plan, actor="test", reason="drifting vectors")
    wait_for(lambda: gw.served_state()["effective_percent"] == 50, 30, "the 50 % step")
    embed_requests(gw, 100, 150, ramp_env)
    ramp = wait_for(lambda: (r := ramp_env.ramps.get()).status != "running" and r, 30,
                    "the rollback")
    assert ramp.status == "aborted" and "min_recall_at_10" in ramp.reason, ramp.reason
    after, queries, drifted = embed_until_compared(gw, perturbed, 50)  # the shadow goes on
    assert drifted < 0.8 and after.recall_at_10 < healthy.recall_at_10, (drifted, queries)
    assert after.cosine_mean > 0.5  # still close vectors: the cosine alone looks harmless
    # the window's figure falls: a window from the perturbation on holds the drifted pairs and
    # at most a few others, each counted here as a full hit
    now, counted = status_recall(gw, monkeypatch, int(time.time() - since) + 2)
    assert counted >= queries, (counted, queries)
    bound = (counted - queries + drifted * queries) / counted
    assert now < shown and now <= bound + 5e-4, (shown, now, bound, counted, queries)
    count, total = (now - then for now, then in zip(recall_histogram(scrape(gw)), scraped,
                                                   strict=True))
    assert count > 0 and total / count < 0.8, (count, total)  # Prometheus shows it too
    assert ramp_env.states.get().canary_bp == 0
    print(f"\nrecall@10 healthy {recall:.3f}, drifting {drifted:.3f} over {queries} pairs; "
          f"rollout status: {shown:.4f} -> {now:.4f}")
