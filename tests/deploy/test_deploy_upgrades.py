"""How the chart's Deployments are upgraded: a RollingUpdate that starts a new pod before it stops
an old one by default (updateStrategy), Recreate on request, a service's or a pool's own strategy,
and the combinations the API server would refuse named at render time. (Old and new versions side
by side on one Redis: tests/e2e/test_upgrade_skew.py.)"""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy.deploy_support import Render, Rendered, find_tool, run

GATEWAY = {"gateway": {"enabled": True, "keys": {"existingSecret": "gateway-keys"}}}
POOLS = {"toolWorkers": {"pools": [{"name": "default", "queue": "default"}, {"name": "heavy", "queue": "heavy"}]}}


def strategies(r: Rendered) -> dict[str, dict[str, Any]]:
    assert r.returncode == 0, r.stderr
    return {d["metadata"]["name"]: d["spec"].get("strategy") for d in r.of_kind("Deployment")}


def test_every_deployment_rolls_a_new_pod_in_before_an_old_one_out(render: Render) -> None:
    found = strategies(render(values={**GATEWAY, **POOLS}))
    assert len(found) == 6
    for name, strategy in found.items():
        assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}, name


def test_recreate_drops_the_rolling_update_settings(render: Render) -> None:
    r = render(values={**GATEWAY, "updateStrategy": {"type": "Recreate"}})
    assert set(map(str, strategies(r).values())) == {str({"type": "Recreate"})}
    validator = find_tool("kubernetes-validate")
    proc = run([validator, "--strict", "-k", "1.31.0", "-"], stdin=r.stdout, timeout_s=120)
    assert proc.returncode == 0 and "ERROR" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_a_service_or_a_pool_has_its_own_strategy(render: Render) -> None:
    pools = {
        "toolWorkers": {
            "strategy": {"type": "Recreate"},
            "pools": [
                {"name": "default", "queue": "default"},
                {
                    "name": "heavy",
                    "queue": "heavy",
                    "strategy": {"rollingUpdate": {"maxSurge": "50%", "maxUnavailable": 0}},
                },
            ],
        }
    }
    values = {
        **GATEWAY,
        **pools,
        "agentLoop": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 2, "maxUnavailable": 1}}},
        "gateway": {**GATEWAY["gateway"], "strategy": {"rollingUpdate": {"maxUnavailable": "25%"}}},
    }
    found = strategies(render(values=values))
    assert found["t-agentstream-agent-loop"]["rollingUpdate"] == {"maxSurge": 2, "maxUnavailable": 1}
    assert found["t-agentstream-tool-worker-default"] == {"type": "Recreate"}
    assert found["t-agentstream-tool-worker-heavy"] == {"rollingUpdate": {"maxSurge": "50%", "maxUnavailable": 0}}
    assert found["t-agentstream-gateway"] == {"rollingUpdate": {"maxUnavailable": "25%"}}
    assert found["t-agentstream-delegation"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"updateStrategy": {"rollingUpdate": {"maxSurge": 0}}},
            "updateStrategy: maxSurge and maxUnavailable are both 0",
        ),
        (
            {"compaction": {"strategy": {"rollingUpdate": {"maxSurge": "0%", "maxUnavailable": 0}}}},
            "compaction.strategy: maxSurge and maxUnavailable are both 0",
        ),
        (
            {
                "toolWorkers": {
                    "pools": [
                        {"name": "p", "queue": "q", "strategy": {"rollingUpdate": {"maxSurge": 0, "maxUnavailable": 0}}}
                    ]
                }
            },
            "toolWorkers.pools[0].strategy: maxSurge and maxUnavailable are both 0",
        ),
        ({"updateStrategy": {"type": "BlueGreen"}}, "updateStrategy.type"),
        ({"agentLoop": {"strategy": {"rollingUpdate": {"maxSurge": "lots"}}}}, "maxSurge"),
    ],
    ids=["global", "service", "pool", "unknown type", "not a number or percentage"],
)
def test_a_strategy_that_cannot_roll_is_refused(render: Render, values: dict[str, Any], message: str) -> None:
    r = render(values=values)
    assert r.returncode != 0 and message in r.stderr, r.stderr
