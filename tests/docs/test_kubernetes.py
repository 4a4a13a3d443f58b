"""docs/kubernetes.md is what an operator copies, so every YAML block on it is checked: the Kubernetes
manifests against the API schemas of a pinned Kubernetes version (an unknown field fails), and the
Zero to JupyterHub values by turning them into KubeSpawner traits as the chart's hub configuration
does and asking KubeSpawner 7 for the pod it would create, which must have what the page promises
and validate too. No cluster: KubeSpawner builds the manifest from a kubeconfig that points nowhere,
for users JupyterHub makes from its own database, as the hub does."""
from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from jupyterhub import orm
from jupyterhub.objects import Hub
from jupyterhub.user import User
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.config import kube_config
from kubespawner import KubeSpawner
from traitlets.config import Config
from traitlets.config.loader import KVArgParseConfigLoader

from jupyter_gpucr.daemon.protocol import DEFAULT_SOCKET
from jupyter_gpucr.server.config import GPUCR
from jupyter_gpucr.server.remote import remote_url

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "kubernetes.md"
DAEMONSET_FILE = ROOT / "deploy" / "kubernetes" / "gpucr-daemon.yaml"
KUBERNETES = "1.30"  # the API the manifests are checked against: they must not need anything newer
VALUES_FILE = re.compile(r"# (config[\w-]*\.yaml)\b")

# singleuser.KEY -> the KubeSpawner trait the chart's jupyterhub_config.py (Zero to JupyterHub 4) sets
# from it. The chart adds its default user-pod tolerations to extraTolerations; they are left out here.
SINGLEUSER_TRAITS = {
    "startTimeout": "start_timeout",
    "uid": "uid",
    "fsGid": "fs_gid",
    "serviceAccountName": "service_account",
    "nodeSelector": "node_selector",
    "extraNodeAffinity.required": "node_affinity_required",
    "extraNodeAffinity.preferred": "node_affinity_preferred",
    "extraTolerations": "tolerations",
    "extraResource.limits": "extra_resource_limits",
    "extraEnv": "environment",
}
# Keys mapped by hand below; a value under any of them is taken whole.
OTHER_KEYS = {"singleuser.cmd", "singleuser.image.name", "singleuser.image.tag", "singleuser.storage.extraVolumes",
              "singleuser.storage.extraVolumeMounts", "hub.config", "hub.extraConfig", "cull.enabled", "cull.timeout",
              "cull.every"}
KNOWN_KEYS = {f"singleuser.{key}" for key in SINGLEUSER_TRAITS} | OTHER_KEYS
# The chart's defaults (its values.yaml) for what the assertions read and the page may leave unset.
CHART_DEFAULTS = {"singleuser": {"uid": 1000, "fsGid": 100, "startTimeout": 300, "cmd": "jupyterhub-singleuser"},
                  "cull": {"enabled": True, "timeout": 3600, "every": 600}}


def yaml_blocks() -> list[str]:
    return re.findall(r"^```yaml\n(.*?)^```", PAGE.read_text(), flags=re.S | re.M)


def manifests() -> list[dict[str, Any]]:
    return [doc for block in yaml_blocks() if not VALUES_FILE.match(block) for doc in yaml.safe_load_all(block) if doc]


def manifest(kind: str) -> dict[str, Any]:
    (found,) = [doc for doc in manifests() if doc["kind"] == kind]
    return found


def values(name: str) -> dict[str, Any]:
    """The chart values the page gives as the file ``name`` (a block whose first line is ``# name``)."""
    (found,) = [block for block in yaml_blocks() if (m := VALUES_FILE.match(block)) and m.group(1) == name]
    return yaml.safe_load(found)


def helm_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Values of ``helm -f base -f over``: maps are merged key by key, anything else (lists too) replaced."""
    merged = dict(base)
    for key, value in over.items():
        merged[key] = helm_merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) else value
    return merged


def dig(tree: dict[str, Any], dotted: str) -> Any:
    for key in dotted.split("."):
        if not isinstance(tree, dict) or key not in tree:
            return None
        tree = tree[key]
    return tree


def unmapped_keys(tree: dict[str, Any], prefix: str = "") -> list[str]:
    """Keys of the values this test does not know how the chart turns into configuration."""
    unknown = []
    for key, value in tree.items():
        path = prefix + key
        if path in KNOWN_KEYS:
            continue
        if isinstance(value, dict) and any(known.startswith(path + ".") for known in KNOWN_KEYS):
            unknown += unmapped_keys(value, path + ".")
        else:
            unknown.append(path)
    return unknown


def spawner_config(chart_values: dict[str, Any]) -> Config:
    """What the chart's hub configuration sets from these values, in its order (hub.extraConfig last)."""
    assert unmapped_keys(chart_values) == [], "keys this test does not map to KubeSpawner traits (add them here)"
    config = Config()
    config.KubeSpawner.namespace = manifest("Secret")["metadata"]["namespace"]  # the chart's: the release's namespace
    for key, trait in SINGLEUSER_TRAITS.items():
        if (value := dig(chart_values, f"singleuser.{key}")) is not None:
            config.KubeSpawner[trait] = value
    config.Spawner.cmd = dig(chart_values, "singleuser.cmd")
    image = dig(chart_values, "singleuser.image")
    config.KubeSpawner.image = f"{image['name']}:{image['tag']}"
    config.KubeSpawner.volumes = list(dig(chart_values, "singleuser.storage.extraVolumes") or [])
    config.KubeSpawner.volume_mounts = list(dig(chart_values, "singleuser.storage.extraVolumeMounts") or [])
    for cls, traits in (dig(chart_values, "hub.config") or {}).items():
        assert cls != "KubeSpawner" or set(traits) <= set(KubeSpawner.class_traits(config=True)), traits
        config[cls].update(traits)
    for _, code in sorted((dig(chart_values, "hub.extraConfig") or {}).items()):
        exec(code, {"c": config})
    return config


async def _pods(config: Config, usernames: list[str]) -> list[tuple[KubeSpawner, dict[str, Any]]]:
    db = orm.new_session_factory("sqlite://")()
    hub = Hub(ip="hub", port=8081, base_url="/hub/")
    made = []
    for name in usernames:
        orm_user = orm.User(name=name)
        db.add(orm_user)
        db.commit()
        spawner = User(orm_user, settings={"spawner_class": KubeSpawner, "config": config, "hub": hub}).spawners[""]
        pod = await spawner.get_pod_manifest()
        async with ApiClient() as api:
            made.append((spawner, api.sanitize_for_serialization(pod)))
    await made[0][0].api.api_client.close()
    return made


@pytest.fixture
def pods_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """KubeSpawner's pods for these values and users; it reads a kubeconfig at start and calls nothing."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "none",
        "clusters": [{"name": "none", "cluster": {"server": "https://127.0.0.1:9"}}],
        "users": [{"name": "none", "user": {"token": "none"}}],
        "contexts": [{"name": "none", "context": {"cluster": "none", "user": "none"}}]}))
    # what $KUBECONFIG names, read once when kubernetes_asyncio is imported (before this fixture runs)
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)

    def make(chart_values: dict[str, Any], *usernames: str) -> list[tuple[KubeSpawner, dict[str, Any]]]:
        return asyncio.run(_pods(spawner_config(helm_merge(CHART_DEFAULTS, chart_values)), list(usernames)))
    return make


def server_options(container: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> GPUCR:
    """The GPUCR options the server in this container starts with: its command line and its environment."""
    argv = [arg for arg in container["args"] if arg.startswith("--GPUCR.")]
    config = KVArgParseConfigLoader(argv=argv, classes=[GPUCR]).load_config()
    assert set(config.GPUCR) <= set(GPUCR.class_traits(config=True)), argv
    for env in container["env"]:
        if env["name"].startswith("GPUCR_"):
            monkeypatch.setenv(env["name"], env["value"])
    return GPUCR(config=config)


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {env["name"]: env for env in container["env"]}


def mount_for(pod: dict[str, Any], path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The volume mount that ``path`` lies in, and its volume."""
    (container,) = pod["spec"]["containers"]
    mounts = [m for m in container["volumeMounts"] if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")]
    assert mounts, f"nothing is mounted at {path}"
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == mount["name"]]
    return mount, volume


def test_every_yaml_block_is_a_manifest_or_a_named_values_file() -> None:
    for block in yaml_blocks():
        docs = [doc for doc in yaml.safe_load_all(block) if doc]
        assert VALUES_FILE.match(block) or all({"apiVersion", "kind", "metadata"} <= set(doc) for doc in docs), block[:80]
    assert sorted(doc["kind"] for doc in manifests()) == ["DaemonSet", "Secret"]


@pytest.mark.parametrize("doc", manifests(), ids=lambda doc: f"{doc['kind']}/{doc['metadata']['name']}")
def test_manifest_is_valid_kubernetes(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_deploy_file_is_the_daemonset_on_the_page() -> None:
    assert list(yaml.safe_load_all(DAEMONSET_FILE.read_text())) == [manifest("DaemonSet")]


def test_daemonset_has_what_the_daemon_needs() -> None:
    spec = manifest("DaemonSet")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert spec["hostPID"] and container["securityContext"]["privileged"]
    socket = container["command"][container["command"].index("--socket") + 1]
    assert socket == DEFAULT_SOCKET  # where servers look unless configured otherwise
    mount, volume = mount_for({"spec": spec}, socket)
    assert volume["hostPath"]["path"] == mount["mountPath"] == os.path.dirname(DEFAULT_SOCKET)
    assert manifest("DaemonSet")["metadata"]["namespace"] == manifest("Secret")["metadata"]["namespace"]


def test_values_use_only_keys_the_test_maps() -> None:
    assert unmapped_keys(values("config.yaml")) == []
    assert unmapped_keys({"singleuser": {"extraEnvv": {}}, "cull": {"timeout": 1}}) == ["singleuser.extraEnvv"]


def test_user_pod_has_the_gpu_the_store_the_credentials_and_the_node(pods_for, monkeypatch: pytest.MonkeyPatch) -> None:
    chart_values = values("config.yaml")
    ((spawner, pod),) = pods_for(chart_values, "alice")
    kubernetes_validate.validate(pod, KUBERNETES, strict=True)
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"

    options = server_options(container, monkeypatch)
    assert remote_url(options) == env_of(container)["GPUCR_STORE"]["value"]
    assert remote_url(options).startswith("s3://")
    secret = manifest("Secret")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        ref = env_of(container)[name]["valueFrom"]["secretKeyRef"]
        assert ref["name"] == secret["metadata"]["name"] and ref["key"] in secret["stringData"], name

    # it lands on the nodes the daemon's DaemonSet selects, and the daemon tolerates what it tolerates
    daemon = manifest("DaemonSet")["spec"]["template"]["spec"]
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    expressions = [e for term in terms for e in term["matchExpressions"]]
    assert [{"key": key, "operator": "In", "values": [value]} for key, value in daemon["nodeSelector"].items()] == expressions
    assert all(toleration in daemon["tolerations"] for toleration in pod["spec"]["tolerations"])

    # the stop: the grace period is what the server is told, above its budget; the hub waits longer still
    assert spawner.delete_grace_period == options.spawner_stop_timeout > options.stop_budget
    assert spawner.start_timeout > spawner.delete_grace_period
    # idle kernels go to the store before the culler stops the server
    assert 0 < options.idle_timeout < dig(helm_merge(CHART_DEFAULTS, chart_values), "cull.timeout")

    mount, volume = mount_for(pod, options.cache_dir)
    assert "emptyDir" in volume and not mount.get("readOnly")
    assert [v for v in pod["spec"]["volumes"] if "hostPath" in v] == []  # no daemon socket: the snapshot engine


def test_daemon_values_give_each_user_a_uid_and_the_socket(pods_for, monkeypatch: pytest.MonkeyPatch) -> None:
    chart_values = helm_merge(values("config.yaml"), values("config-daemon.yaml"))
    made = pods_for(chart_values, "alice", "bob")
    uids = set()
    for _, pod in made:
        kubernetes_validate.validate(pod, KUBERNETES, strict=True)
        (container,) = pod["spec"]["containers"]
        uids.add(container["securityContext"]["runAsUser"])
        mount, volume = mount_for(pod, DEFAULT_SOCKET)
        daemon_mount, daemon_volume = mount_for(manifest("DaemonSet")["spec"]["template"], DEFAULT_SOCKET)
        assert volume["hostPath"]["path"] == daemon_volume["hostPath"]["path"] and mount["readOnly"]
        assert "emptyDir" in mount_for(pod, server_options(container, monkeypatch).cache_dir)[1]  # still there
    assert len(uids) == 2 and not uids & {0, 1000}
