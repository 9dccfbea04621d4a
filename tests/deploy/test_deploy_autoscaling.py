"""KEDA scales a tool pool on the SUM of its lag (and pending entries) over the partitions of its
stream, not on the largest partition's: the rendered ScaledObject's scalingModifiers formula adds
every partition's trigger, and the replicas it asks for are computed here for given lags the way
KEDA and the HPA do (composite metric, AverageValue target, ceiling, clamped to min/max)."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest

from tests.deploy.deploy_support import Render

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def expr_value(formula: str, metrics: dict[str, float]) -> float:
    """The value of a formula of the form the chart writes, in expr-lang's syntax (names, numbers,
    + and /, parentheses, and at most one `a > b ? c : d`); `/` gives a float, as in expr."""
    names = set(IDENTIFIER.findall(formula))
    assert names <= metrics.keys(), f"the formula names triggers that do not exist: {names - metrics.keys()}"

    def value(text: str) -> float:
        assert re.fullmatch(r"[A-Za-z0-9_ +/().]+", text), text
        return float(eval(text, {"__builtins__": {}}, dict(metrics)))

    if "?" in formula:
        condition, _, branches = formula.partition(" ? ")
        yes, _, no = branches.partition(" : ")
        left, _, right = condition.partition(" > ")
        return value(yes) if value(left) > value(right) else value(no)
    return value(formula)


def desired_replicas(so: dict[str, Any], metrics: dict[str, float], *, current: int = 1) -> int:
    """The replicas KEDA's HPA asks for, given each trigger's metric value (trigger name → value).

    With scalingModifiers: one composite metric, ceil(formula / target) (AverageValue). Without: each
    trigger its own metric, ceil(value / its target), and the HPA takes the largest. Clamped to
    [minReplicaCount, maxReplicaCount]; a pool at zero stays there unless a metric passes activation.
    """
    spec = so["spec"]
    triggers = {t["name"]: t for t in spec["triggers"]}
    assert metrics.keys() == triggers.keys(), "give every trigger's value"
    modifiers = spec.get("advanced", {}).get("scalingModifiers")
    if modifiers:
        composite = expr_value(modifiers["formula"], metrics)
        active = composite > float(modifiers.get("activationTarget", "0"))
        wanted = math.ceil(composite / float(modifiers["target"]))
    else:
        wanted, active = 0, False
        for name, t in triggers.items():
            md = t["metadata"]
            target = float(md.get("lagCount") or md["pendingEntriesCount"])
            wanted = max(wanted, math.ceil(metrics[name] / target))
            active = active or metrics[name] > float(md.get("activationLagCount", "0"))
    low, high = spec["minReplicaCount"], spec["maxReplicaCount"]
    if not active and low == 0:
        return 0
    return max(low, min(high, max(wanted, 1 if current or active else 0)))


def render_pool(render: Render, *, partitions: int, **keda: Any) -> dict[str, Any]:
    r = render(values={"partitions": partitions, "autoscaling": {"maxReplicas": 50, "keda": {"enabled": True, **keda}}})
    assert r.returncode == 0, r.stderr
    (so,) = r.of_kind("ScaledObject")
    return so


def spread(total: int, partitions: int, kind: str) -> dict[str, float]:
    """``total`` entries spread evenly over the partitions' triggers of one kind (lag or pending)."""
    base, extra = divmod(total, partitions)
    return {f"{kind}_p{k}": float(base + (1 if k < extra else 0)) for k in range(partitions)}


def test_several_partitions_feed_one_formula_that_adds_them(render: Render) -> None:
    so = render_pool(render, partitions=3)
    modifiers = so["spec"]["advanced"]["scalingModifiers"]
    names = {t["name"] for t in so["spec"]["triggers"]}
    assert names == {f"{kind}_p{k}" for kind in ("lag", "pending") for k in range(3)}
    assert set(IDENTIFIER.findall(modifiers["formula"])) == names, "every trigger is in the formula, once each kind"
    assert modifiers["target"] == "1" and modifiers["metricType"] == "AverageValue"
    # KEDA's ScalingModifiers (keda.sh/v1alpha1): these four fields, strings, metricType AverageValue or Value
    assert set(modifiers) <= {"formula", "target", "activationTarget", "metricType"}
    assert all(isinstance(v, str) for v in modifiers.values())
    assert float(modifiers["target"]) > 0 and float(modifiers["activationTarget"]) >= 0
    for name in names:
        assert IDENTIFIER.fullmatch(name), f"{name}: expr reads trigger names as identifiers"


@pytest.mark.parametrize(
    ("lags", "want"),
    [
        ({"lag_p0": 10, "lag_p1": 10, "lag_p2": 10}, 6),  # the field case: 30 jobs over 3 partitions
        ({"lag_p0": 28, "lag_p1": 1, "lag_p2": 1}, 6),  # uneven: still the sum
        ({"lag_p0": 0, "lag_p1": 0, "lag_p2": 1}, 1),
        ({"lag_p0": 100, "lag_p1": 100, "lag_p2": 100}, 50),  # capped at maxReplicas
    ],
)
def test_replicas_follow_the_sum_of_the_lag(render: Render, lags: dict[str, float], want: int) -> None:
    so = render_pool(render, partitions=3)
    metrics = {**lags, **spread(0, 3, "pending")}
    assert desired_replicas(so, metrics) == want
    largest = min(50, max(math.ceil(v / 5) for v in lags.values()))  # what one trigger per partition gave
    if len(set(lags.values())) == 1 and sum(lags.values()) > 5:
        assert want > largest, "the sum asks for more than the largest partition alone"


def test_running_jobs_over_partitions_keep_the_slots_full(render: Render) -> None:
    so = render_pool(render, partitions=3)
    # 40 jobs running (pending) over 3 partitions, nothing waiting: ceil(160 / 64) pods
    assert desired_replicas(so, {**spread(0, 3, "lag"), **spread(160, 3, "pending")}) == 3
    # both: the larger of lag/lagCount and pending/concurrency
    assert desired_replicas(so, {**spread(12, 3, "lag"), **spread(160, 3, "pending")}) == 3
    assert desired_replicas(so, {**spread(30, 3, "lag"), **spread(160, 3, "pending")}) == 6


def test_lag_alone_and_pending_alone_sum_against_their_own_target(render: Render) -> None:
    lag_only = render_pool(render, partitions=2, pendingTrigger=False, lagCount=4, activationLagCount=2)
    modifiers = lag_only["spec"]["advanced"]["scalingModifiers"]
    assert (modifiers["target"], modifiers["activationTarget"]) == ("4", "2")
    assert desired_replicas(lag_only, spread(17, 2, "lag")) == 5
    pending_only = render_pool(render, partitions=2, lagCount=0)
    assert pending_only["spec"]["advanced"]["scalingModifiers"]["target"] == "64"
    assert desired_replicas(pending_only, spread(129, 2, "pending")) == 3


def test_a_pool_at_zero_wakes_on_the_total_lag(render: Render) -> None:
    r = render(
        values={
            "partitions": 3,
            "autoscaling": {"minReplicas": 0, "keda": {"enabled": True, "lagCount": 5, "activationLagCount": 2}},
        }
    )
    (so,) = r.of_kind("ScaledObject")
    assert so["spec"]["advanced"]["scalingModifiers"]["activationTarget"] == "0.4"  # 2 entries, over lagCount 5
    idle = {**spread(0, 3, "lag"), **spread(0, 3, "pending")}
    assert desired_replicas(so, idle, current=0) == 0
    # one entry on each partition: 3 in all, above the activation lag of 2 though no partition is
    assert desired_replicas(so, {**spread(3, 3, "lag"), **spread(0, 3, "pending")}, current=0) == 1


def test_one_partition_needs_no_formula(render: Render) -> None:
    so = render_pool(render, partitions=1)
    assert "scalingModifiers" not in so["spec"].get("advanced", {})
    assert desired_replicas(so, {"lag": 30, "pending": 0}) == 6
    assert desired_replicas(so, {"lag": 0, "pending": 160}) == 3  # ceil(160 / 64)


def test_the_formula_sits_beside_the_hpa_behavior(render: Render) -> None:
    behavior = {"scaleDown": {"stabilizationWindowSeconds": 120}}
    r = render(values={"partitions": 2, "autoscaling": {"behavior": behavior, "keda": {"enabled": True}}})
    (so,) = r.of_kind("ScaledObject")
    advanced = so["spec"]["advanced"]
    assert advanced["horizontalPodAutoscalerConfig"]["behavior"] == behavior
    assert "lag_p1" in advanced["scalingModifiers"]["formula"]
