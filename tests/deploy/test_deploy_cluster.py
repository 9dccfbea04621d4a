"""The chart on an external Redis Cluster and with partitioned work streams: REDIS_URL's cluster
scheme, AGENTSTREAM_PARTITIONS in every pod, and KEDA triggers on every partition of each pool's
stream (redis-cluster-streams on a cluster); values that cannot work are refused."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import yaml

from agentstream.wire.keys import Keys
from tests.deploy.deploy_support import CHART, RELEASE, Render, run

CLUSTER = {
    "redis": {
        "bundled": {"enabled": False},
        "external": {"enabled": True, "url": "redis://redis-cluster.example.com:7000", "cluster": True},
    },
    "autoscaling": {"keda": {"enabled": True}},
    "partitions": 3,
}


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def _pods(rendered) -> list[dict[str, Any]]:
    return [c for d in rendered.of_kind("Deployment") for c in d["spec"]["template"]["spec"]["containers"]]


def test_an_external_cluster_gets_the_cluster_scheme_and_the_partitions_in_every_pod(render: Render) -> None:
    r = render(values=CLUSTER)
    assert r.returncode == 0, r.stderr
    pods = _pods(r)
    assert pods
    for container in pods:
        env = _env(container)
        assert env["REDIS_URL"] == "redis+cluster://redis-cluster.example.com:7000/0"
        assert env["AGENTSTREAM_PARTITIONS"] == "3"
    (test_pod,) = [p for p in r.of_kind("Pod") if "test" in p["metadata"]["name"]]
    test_env = _env(test_pod["spec"]["containers"][0])
    assert test_env["REDIS_URL"].startswith("redis+cluster://") and test_env["AGENTSTREAM_PARTITIONS"] == "3"


def test_tls_on_a_cluster_is_the_rediss_cluster_scheme(render: Render) -> None:
    values = {**CLUSTER, "redis": {**CLUSTER["redis"], "external": {**CLUSTER["redis"]["external"], "tls": True}}}
    r = render(values=values)
    assert r.returncode == 0, r.stderr
    assert {_env(c)["REDIS_URL"] for c in _pods(r)} == {"rediss+cluster://redis-cluster.example.com:7000/0"}


def test_keda_has_one_trigger_per_partition_stream_on_a_cluster(render: Render) -> None:
    r = render(values=CLUSTER)
    (so,) = r.of_kind("ScaledObject")
    triggers = so["spec"]["triggers"]
    keys = Keys("agentstream", 3)
    streams = keys.partitions_of(keys.tools("default"))
    assert streams == ["agentstream:tools:default", "agentstream:tools:default:p1", "agentstream:tools:default:p2"]
    for kind in ("lag", "pending"):
        mine = [t for t in triggers if t["name"].startswith(kind)]
        assert [t["metadata"]["stream"] for t in mine] == streams  # every partition, each once
        assert [t["name"] for t in mine] == [f"{kind}_p{k}" for k in range(3)]
    for t in triggers:
        assert t["type"] == "redis-cluster-streams"
        md = t["metadata"]
        assert md["addresses"] == "redis-cluster.example.com:7000"
        assert "address" not in md and "databaseIndex" not in md  # a cluster has no databases
        assert md["consumerGroup"] == "tool-workers"
        assert all(isinstance(v, str) for v in md.values()), "KEDA metadata values are strings"
    assert len({t["name"] for t in triggers}) == len(triggers)


def test_partitions_on_a_single_redis_keep_redis_streams_triggers(render: Render) -> None:
    r = render(values={"autoscaling": {"keda": {"enabled": True}}, "partitions": 2})
    (so,) = r.of_kind("ScaledObject")
    assert {t["type"] for t in so["spec"]["triggers"]} == {"redis-streams"}
    assert sorted((t["name"], t["metadata"]["stream"]) for t in so["spec"]["triggers"]) == [
        ("lag_p0", "agentstream:tools:default"),
        ("lag_p1", "agentstream:tools:default:p1"),
        ("pending_p0", "agentstream:tools:default"),
        ("pending_p1", "agentstream:tools:default:p1"),
    ]
    assert all("databaseIndex" in t["metadata"] for t in so["spec"]["triggers"])


def test_one_partition_keeps_the_trigger_names_and_streams_of_before(render: Render) -> None:
    r = render(values={"autoscaling": {"keda": {"enabled": True}}})
    (so,) = r.of_kind("ScaledObject")
    assert sorted((t["name"], t["metadata"]["stream"]) for t in so["spec"]["triggers"]) == [
        ("lag", "agentstream:tools:default"),
        ("pending", "agentstream:tools:default"),
    ]
    assert {_env(c)["AGENTSTREAM_PARTITIONS"] for c in _pods(r)} == {"1"}


def test_cluster_values_that_cannot_work_are_refused(render: Render) -> None:
    bundled = render(values={"redis": {"external": {"cluster": True}}})
    assert bundled.returncode != 0 and "redis.external.cluster needs redis.external.enabled=true" in bundled.stderr
    database = render(
        values={"redis": {**CLUSTER["redis"], "external": {**CLUSTER["redis"]["external"], "url": "redis://r:7000/3"}}}
    )
    assert database.returncode != 0 and "database other than 0" in database.stderr
    zero = render(values={"partitions": 0})
    assert zero.returncode != 0 and "partitions" in zero.stderr


def test_notes_tell_a_cluster_backend_how_to_publish_to_a_partition(helm: str, tmp_path: Path) -> None:
    chart = tmp_path / "agentstream"
    shutil.copytree(CHART, chart)
    shutil.copy(chart / "templates" / "NOTES.txt", chart / "notes-under-test.txt")
    (chart / "templates" / "zz-notes-under-test.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\n"
        'data:\n  notes: {{ tpl (.Files.Get "notes-under-test.txt") . | toJson }}\n'
    )
    values = tmp_path / "cluster.yaml"
    values.write_text(yaml.safe_dump(CLUSTER))
    proc = run(
        [helm, "template", RELEASE, str(chart), "--show-only", "templates/zz-notes-under-test.yaml", "-f", str(values)]
    )
    assert proc.returncode == 0, proc.stderr
    notes = yaml.safe_load(proc.stdout)["data"]["notes"]
    assert "redis-cli -c -u 'redis://redis-cluster.example.com:7000/0'" in notes  # redis-cli's own scheme, cluster mode
    assert "agentstream partition <trace id>" in notes and "agentstream:turns:p<k>" in notes
