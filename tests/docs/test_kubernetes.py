"""docs/kubernetes.md and deploy/ are what an operator copies, so every YAML block on the page and every
file of deploy/kubernetes (as kustomize renders it) and deploy/z2jh is checked: the Kubernetes manifests
against the API schemas of a pinned Kubernetes version (an unknown field fails), and the Zero to
JupyterHub values by turning them into KubeSpawner traits as the chart's hub configuration does and
asking KubeSpawner 7 for the pod it would create, which must have what the page promises and validate
too. The images they name are the ones the page's `docker build` commands make from images/. No
cluster: KubeSpawner builds the manifest from a kubeconfig that points nowhere, for users JupyterHub
makes from its own database, as the hub does."""
from __future__ import annotations

import asyncio
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
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

from jupyter_gpucr import __version__
from jupyter_gpucr.daemon.protocol import DEFAULT_SOCKET
from jupyter_gpucr.server.config import GPUCR
from jupyter_gpucr.server.remote import remote_url

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "kubernetes.md"
KUSTOMIZE_DIR = ROOT / "deploy" / "kubernetes"
DAEMONSET_FILE = KUSTOMIZE_DIR / "gpucr-daemon.yaml"
Z2JH_VALUES = ROOT / "deploy" / "z2jh" / "values.yaml"
Z2JH_DAEMON_VALUES = ROOT / "deploy" / "z2jh" / "values-daemon.yaml"
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
    "extraPodConfig": "extra_pod_config",
}
# Keys mapped by hand below; a value under any of them is taken whole.
OTHER_KEYS = {"singleuser.cmd", "singleuser.image.name", "singleuser.image.tag", "singleuser.storage.extraVolumes",
              "singleuser.storage.extraVolumeMounts", "singleuser.storage.type", "singleuser.storage.capacity",
              "singleuser.storage.homeMountPath", "hub.config", "hub.extraConfig", "cull.enabled", "cull.timeout",
              "cull.every"}
KNOWN_KEYS = {f"singleuser.{key}" for key in SINGLEUSER_TRAITS} | OTHER_KEYS
# The chart's defaults (its values.yaml) for what the assertions read and the page may leave unset.
CHART_DEFAULTS = {"singleuser": {"uid": 1000, "fsGid": 100, "startTimeout": 300, "cmd": "jupyterhub-singleuser",
                                 "storage": {"type": "dynamic", "capacity": "10Gi", "homeMountPath": "/home/jovyan"}},
                  "cull": {"enabled": True, "timeout": 3600, "every": 600}}
# The names the chart gives each user's volume and claim (singleuser.storage.dynamic's defaults).
HOME_VOLUME, HOME_CLAIM = "volume-{user_server}", "claim-{user_server}"


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
    if dig(chart_values, "singleuser.storage.type") == "dynamic":  # a PVC per user, mounted as the home
        config.KubeSpawner.pvc_name_template = HOME_CLAIM
        config.KubeSpawner.storage_pvc_ensure = True
        config.KubeSpawner.storage_capacity = dig(chart_values, "singleuser.storage.capacity")
        config.KubeSpawner.volumes = [{"name": HOME_VOLUME, "persistentVolumeClaim": {"claimName": "{pvc_name}"}},
                                      *config.KubeSpawner.volumes]
        config.KubeSpawner.volume_mounts = [{"name": HOME_VOLUME, "mountPath": dig(chart_values, "singleuser.storage.homeMountPath")},
                                            *config.KubeSpawner.volume_mounts]
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
    assert "namespace" not in manifest("DaemonSet")["metadata"]  # kustomization.yaml sets it


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


# -- deploy/: the images, the daemon's kustomization and the Zero to JupyterHub recipe -------------------------

DOCKERFILES = ("images/singleuser/Dockerfile", "images/daemon/Dockerfile")


def built_images() -> dict[str, str]:
    """Dockerfile -> the NAME:TAG that the page's ``docker build`` commands give its image."""
    built = {}
    for block in re.findall(r"^```bash\n(.*?)^```", PAGE.read_text(), flags=re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            argv = shlex.split(line, comments=True)
            if argv[:2] == ["docker", "build"]:
                assert argv[-1] == ".", line  # the build context is the repository root (.dockerignore)
                built[argv[argv.index("-f") + 1]] = argv[argv.index("-t") + 1]
    return built


def kustomization() -> dict[str, Any]:
    return yaml.safe_load((KUSTOMIZE_DIR / "kustomization.yaml").read_text())


def kustomize_build() -> list[dict[str, Any]]:
    """What ``kubectl apply -k deploy/kubernetes`` applies: the resources with the kustomization's namespace
    (a Namespace object is renamed to it) and images, as kustomize renders the fields this one uses."""
    k = kustomization()
    assert set(k) <= {"apiVersion", "kind", "namespace", "resources", "images"}, "fields this rendering ignores"
    images = {i["name"]: f"{i.get('newName', i['name'])}:{i['newTag']}" for i in k.get("images", [])}
    rendered = []
    for resource in k["resources"]:
        for doc in yaml.safe_load_all((KUSTOMIZE_DIR / resource).read_text()):
            assert "namespace" not in doc["metadata"], f"{resource} hard-codes its namespace"
            if doc["kind"] == "Namespace":
                doc["metadata"]["name"] = k["namespace"]
            else:
                doc["metadata"]["namespace"] = k["namespace"]
            for container in dig(doc, "spec.template.spec.containers") or []:
                container["image"] = images.get(container["image"].rsplit(":", 1)[0], container["image"])
            rendered.append(doc)
    return rendered


def rendered(kind: str) -> dict[str, Any]:
    (found,) = [doc for doc in kustomize_build() if doc["kind"] == kind]
    return found


def z2jh_values(*files: Path) -> dict[str, Any]:
    """The values of ``helm ... -f FILE -f FILE2``."""
    merged: dict[str, Any] = {}
    for file in files:
        merged = helm_merge(merged, yaml.safe_load(file.read_text()))
    return merged


def test_page_builds_each_image_from_its_dockerfile() -> None:
    built = built_images()
    assert sorted(built) == sorted(DOCKERFILES)
    for dockerfile, image in built.items():
        assert (ROOT / dockerfile).is_file()
        assert image.endswith(f":{__version__}"), image


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_dockerfile_bases_are_pinned_and_its_sources_exist(dockerfile: str) -> None:
    text = (ROOT / dockerfile).read_text()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, flags=re.M))
    stages = re.findall(r"^FROM \S+ AS (\w+)$", text, flags=re.M)
    for base in re.findall(r"^FROM (\S+)", text, flags=re.M):
        image = args[base[2:-1]] if base.startswith("${") else base
        name, _, tag = image.rpartition(":")
        assert name and tag not in ("", "latest") and "/" not in tag, f"{image}: pin the base by its tag"
    for source in re.findall(r"^COPY (?:--from=(\w+) )?(?:--chown=\S+ )?(\S+) \S+$", text, flags=re.M):
        stage, path = source
        assert stage in stages if stage else (ROOT / path).exists(), source
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    # a clean tree: the wheel's lab extension is always the production build made in the image
    assert {"jupyter_gpucr/labextension", "labextension/node_modules", ".venv", ".git"} <= set(ignored)


def test_singleuser_image_is_a_jupyter_image_with_gpucr_enabled() -> None:
    text = (ROOT / DOCKERFILES[0]).read_text()
    base = re.search(r"^ARG BASE_IMAGE=(\S+)$", text, flags=re.M)
    assert base and base.group(1).startswith("quay.io/jupyter/pytorch-notebook:cuda12-")
    assert re.search(r"^FROM \$\{BASE_IMAGE\}$", text, flags=re.M)  # its user, home and start scripts
    assert 'grep -E "jupyter_gpucr.*enabled"' in text and 'grep -E "jupyter-gpucr.*enabled"' in text
    assert "fix-permissions" in text and not re.search(r"^USER ", text, flags=re.M)


def test_daemon_image_has_what_criu_needs_and_no_driver() -> None:
    text = (ROOT / DOCKERFILES[1]).read_text()
    assert "install-criu.sh --bundle-only" in text
    for tool in ("util-linux", "nftables"):
        assert re.search(rf"apt-get install .*\b{tool}\b", text), tool
    assert not re.search(r"apt-get install .*(nvidia|cuda)", text)  # the toolkit mounts the node's at run time


def test_kustomization_sets_the_namespace_and_its_pod_security() -> None:
    namespace, daemonset = rendered("Namespace"), rendered("DaemonSet")
    assert namespace["metadata"]["name"] == daemonset["metadata"]["namespace"] == kustomization()["namespace"]
    # a privileged pod is admitted only where the namespace's Pod Security policy is privileged
    spec = daemonset["spec"]["template"]["spec"]
    assert spec["hostPID"] and spec["containers"][0]["securityContext"]["privileged"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    for doc in kustomize_build():
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_kustomize_renders_the_same() -> None:
    out = subprocess.run(["kubectl", "kustomize", str(KUSTOMIZE_DIR)], capture_output=True, text=True, check=True).stdout
    by_kind = lambda docs: sorted(docs, key=lambda doc: doc["kind"])  # noqa: E731
    assert by_kind(yaml.safe_load_all(out)) == by_kind(kustomize_build())


def test_daemonset_runtime_resources_probes_and_image() -> None:
    spec = rendered("DaemonSet")["spec"]["template"]["spec"]
    assert spec["runtimeClassName"] == "nvidia"
    (container,) = spec["containers"]
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    for probe in ("livenessProbe", "readinessProbe"):
        assert DEFAULT_SOCKET in " ".join(container[probe]["exec"]["command"]), probe
    (image,) = kustomization()["images"]
    built = built_images()[DOCKERFILES[1]]
    assert manifest("DaemonSet")["spec"]["template"]["spec"]["containers"][0]["image"] == built
    assert container["image"] == f"{image['newName']}:{image['newTag']}"
    assert image["newName"].endswith("/" + built.rsplit(":", 1)[0]) and image["newTag"] == built.rsplit(":", 1)[1]


@pytest.mark.skipif(os.geteuid() != 0, reason="the daemon runs as root")
def test_daemon_probes_pass_with_the_daemon_and_fail_without(tmp_path: Path) -> None:
    (container,) = rendered("DaemonSet")["spec"]["template"]["spec"]["containers"]
    socket = str(tmp_path / "daemon.sock")

    def probes() -> list[int]:
        return [subprocess.run([sys.executable if arg == "python3" else arg.replace(DEFAULT_SOCKET, socket)
                                for arg in container[probe]["exec"]["command"]], capture_output=True, timeout=60).returncode
                for probe in ("livenessProbe", "readinessProbe")]

    assert 0 not in probes()
    daemon = subprocess.Popen([sys.executable, "-m", "jupyter_gpucr.daemon.server", "--socket", socket,
                               "--state-dir", str(tmp_path / "state")], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(socket) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert probes() == [0, 0]
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)


def test_z2jh_values_use_only_keys_the_test_maps() -> None:
    assert unmapped_keys(z2jh_values(Z2JH_VALUES, Z2JH_DAEMON_VALUES)) == []


def test_z2jh_recipe_gives_a_gpu_pod_with_gpucr_and_the_store_on_its_volume(pods_for, monkeypatch: pytest.MonkeyPatch) -> None:
    chart_values = z2jh_values(Z2JH_VALUES)
    ((spawner, pod),) = pods_for(chart_values, "alice")
    kubernetes_validate.validate(pod, KUBERNETES, strict=True)
    (container,) = pod["spec"]["containers"]
    assert container["image"].endswith("/" + built_images()[DOCKERFILES[0]])
    assert pod["spec"]["runtimeClassName"] == "nvidia"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"

    options = server_options(container, monkeypatch)
    assert options.suspend_on_stop and 0 < options.idle_timeout < dig(helm_merge(CHART_DEFAULTS, chart_values), "cull.timeout")
    assert spawner.delete_grace_period == options.spawner_stop_timeout > options.stop_budget
    assert spawner.start_timeout > spawner.delete_grace_period
    store = env_of(container)["GPUCR_STORE"]["value"]
    mount, volume = mount_for(pod, store)
    assert volume["persistentVolumeClaim"]["claimName"] == spawner.pvc_name and not mount.get("readOnly")
    assert [v for v in pod["spec"]["volumes"] if "hostPath" in v] == []  # no daemon socket: the snapshot engine

    # it lands on the nodes the daemon's DaemonSet selects, and the daemon tolerates what it tolerates
    daemon = rendered("DaemonSet")["spec"]["template"]["spec"]
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    expressions = [e for term in terms for e in term["matchExpressions"]]
    assert [{"key": key, "operator": "In", "values": [value]} for key, value in daemon["nodeSelector"].items()] == expressions
    assert all(toleration in daemon["tolerations"] for toleration in pod["spec"]["tolerations"])


def test_z2jh_daemon_values_mount_the_daemons_socket(pods_for, monkeypatch: pytest.MonkeyPatch) -> None:
    made = pods_for(z2jh_values(Z2JH_VALUES, Z2JH_DAEMON_VALUES), "alice", "bob")
    _, daemon_volume = mount_for(rendered("DaemonSet")["spec"]["template"], DEFAULT_SOCKET)
    uids = set()
    for spawner, pod in made:
        kubernetes_validate.validate(pod, KUBERNETES, strict=True)
        (container,) = pod["spec"]["containers"]
        mount, volume = mount_for(pod, DEFAULT_SOCKET)
        assert volume["hostPath"]["path"] == daemon_volume["hostPath"]["path"] and mount["readOnly"]
        assert server_options(container, monkeypatch).daemon_socket == DEFAULT_SOCKET
        # the rest of the recipe is still there
        assert pod["spec"]["runtimeClassName"] == "nvidia" and container["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert mount_for(pod, env_of(container)["GPUCR_STORE"]["value"])[1]["persistentVolumeClaim"]["claimName"] == spawner.pvc_name
        uids.add(container["securityContext"]["runAsUser"])
    assert len(uids) == 2 and not uids & {0, 1000}
