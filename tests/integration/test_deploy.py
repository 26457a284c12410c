"""deploy/: cluster-launcher and KubeRay configs checked with Ray's own schema and parsers,
their node tags cross-checked against the example job configs, and the Dockerfile's pins
against pyproject.toml. No cloud, no Kubernetes, no Docker needed."""

from __future__ import annotations

import copy
import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest
import ray
import yaml
from local_cluster_helper import bystander as start_bystander
from local_cluster_helper import end_process, load_local_cluster

from raytrain_hetero.app.config import JobConfig, load_config
from raytrain_hetero.tune.capacity import concurrent_capacity

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
CLUSTER_YAML = DEPLOY / "cluster.yaml"
AWS_S3_YAML = DEPLOY / "aws" / "cluster-s3.yaml"
S3_JOB = REPO / "examples" / "configs" / "eurosat_s3.yaml"
KUBERAY = DEPLOY / "kuberay"
CLUSTER_JOB = REPO / "examples" / "configs" / "eurosat_cluster.yaml"
LOCAL_CLUSTER_JOB = REPO / "examples" / "configs" / "eurosat_local_cluster.yaml"
RAY_SCHEMA = Path(ray.__file__).parent / "autoscaler" / "ray-schema.json"


def load_yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def launcher_config() -> dict:
    return load_yaml(CLUSTER_YAML)


def kuberay_autoscaling_config(ray_cr: dict) -> dict:
    """The autoscaling config Ray's KubeRay autoscaler derives from a RayCluster."""
    from ray.autoscaler._private.kuberay.autoscaling_config import (
        _derive_autoscaling_config_from_ray_cr,
    )

    cr = copy.deepcopy(ray_cr)
    cr["metadata"].setdefault("namespace", "default")  # kubectl fills it in
    return _derive_autoscaling_config_from_ray_cr(cr)


def nodes_at_max(node_types: dict) -> list[dict]:
    """Every node the autoscaler may run: each type's head/min/max expanded."""
    nodes = []
    for node_type in node_types.values():
        count = node_type.get("max_workers", 0) or 1  # max_workers 0: the head, one node
        nodes += [
            {"resources": node_type["resources"], "labels": node_type.get("labels", {})}
        ] * count
    return nodes


def assert_job_fits(job: JobConfig, node_types: dict, head_type: str) -> None:
    pools = {t.get("labels", {}).get("pool") for t in node_types.values()} - {None}
    for spec in job.expanded_workers():
        assert spec.label_selector and spec.label_selector["pool"] in pools, spec.name
        matching = [
            t
            for t in node_types.values()
            if t.get("labels", {}).get("pool") == spec.label_selector["pool"]
        ]
        assert any(
            all(t["resources"].get(k, 0) >= v for k, v in spec.resources.items()) for t in matching
        ), f"worker {spec.name} {dict(spec.resources)} fits no node of pool {spec.label_selector}"
    # The whole worker group at once on the fully scaled cluster (trial_cpus=0: a plain run).
    workers = job.expanded_workers()
    assert concurrent_capacity(nodes_at_max(node_types), workers, trial_cpus=0, limit=1) == 1
    # ... and never on the head: it offers no training resources.
    head = node_types[head_type]
    assert head["resources"].get("CPU", 0) == 0 and head["resources"].get("GPU", 0) == 0
    assert not head.get("labels")
    assert concurrent_capacity([{"resources": head["resources"], "labels": {}}], workers, 0, 1) == 0


# ----------------------------------------------------------------------------- AWS


def test_cluster_yaml_validates_against_rays_schema():
    import jsonschema
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = launcher_config()
    jsonschema.validate(config, json.loads(RAY_SCHEMA.read_text()))
    # Ray's own checks on top of the schema, with the AWS defaults merged in (what `ray up` does).
    validate_config(prepare_config(config))


def test_cluster_yaml_node_types_autoscale_and_head_runs_no_training():
    config = launcher_config()
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert head["resources"] == {"CPU": 0, "GPU": 0} and head["max_workers"] == 0
    workers = {name: t for name, t in types.items() if name != config["head_node_type"]}
    assert len(workers) >= 3
    assert {t["labels"]["pool"] for t in workers.values()} == set(workers)
    assert any(t["resources"].get("GPU", 0) == 0 for t in workers.values())  # a CPU-only type
    assert len({t["resources"].get("GPU", 0) for t in workers.values()}) >= 2
    for t in workers.values():
        assert 0 <= t["min_workers"] <= t["max_workers"]
    assert sum(t["max_workers"] for t in workers.values()) <= config["max_workers"]


def test_cluster_yaml_safe_defaults():
    config = launcher_config()
    head_cmd = " ".join(config["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head_cmd
    for cmd in config["head_start_ray_commands"] + config["worker_start_ray_commands"]:
        assert "RAY_AUTH_MODE=token" in cmd
    assert "-e RAY_AUTH_MODE=token" in config["docker"]["run_options"]
    assert "~/.ray/auth_token" in config["file_mounts"]
    everything = CLUSTER_YAML.read_text()
    assert not re.search(r"^\s*-.*\bray stop\b", everything, re.M)
    assert "0.0.0.0" not in everything
    # Nodes use private VPC addresses only (no public IP per node).
    assert config["provider"]["use_internal_ips"] is True


def test_example_cluster_job_fits_the_aws_node_types():
    config = launcher_config()
    assert_job_fits(
        load_config(CLUSTER_JOB), config["available_node_types"], config["head_node_type"]
    )


# ----------------------------------------------------------------------------- KubeRay


def kuberay_docs() -> dict[str, list[dict]]:
    return {p.name: list(yaml.safe_load_all(p.read_text())) for p in sorted(KUBERAY.glob("*.yaml"))}


def test_kuberay_manifests_parse_and_rayjob_inlines_the_raycluster_spec():
    docs = kuberay_docs()
    (cluster,) = docs["raycluster.yaml"]
    (job,) = docs["rayjob.yaml"]
    assert cluster["apiVersion"] == job["apiVersion"] == "ray.io/v1"
    assert cluster["kind"] == "RayCluster" and job["kind"] == "RayJob"
    assert job["spec"]["rayClusterSpec"] == cluster["spec"]
    assert job["spec"]["shutdownAfterJobFinishes"] is True
    argv = shlex.split(job["spec"]["entrypoint"])
    assert argv[:2] == ["raytrain-hetero", "train"]
    image_path = argv[argv.index("--config") + 1]
    # The Dockerfile copies examples/ to /home/ray/raytrain_hetero/examples.
    assert image_path.startswith("/home/ray/raytrain_hetero/")
    assert (REPO / image_path.removeprefix("/home/ray/raytrain_hetero/")).exists()


def test_kuberay_cluster_autoscales_heterogeneous_groups_by_rays_own_reading():
    import jsonschema

    (cluster,) = kuberay_docs()["raycluster.yaml"]
    spec = cluster["spec"]
    assert spec["enableInTreeAutoscaling"] is True
    assert spec["rayVersion"] == ray.__version__
    autoscaling = kuberay_autoscaling_config(cluster)
    jsonschema.validate(autoscaling, json.loads(RAY_SCHEMA.read_text()))
    types = autoscaling["available_node_types"]
    workers = {k: v for k, v in types.items() if k != "headgroup"}
    assert {name: t["labels"] for name, t in workers.items()} == {
        g["groupName"]: {"pool": g["groupName"]} for g in spec["workerGroupSpecs"]
    }
    assert len({t["resources"].get("GPU", 0) for t in workers.values()}) >= 2
    for group in spec["workerGroupSpecs"]:
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
        assert group["maxReplicas"] > group["minReplicas"]
    assert_job_fits(load_config(CLUSTER_JOB), types, "headgroup")


def test_kuberay_exposes_nothing_outside_the_cluster():
    docs = kuberay_docs()
    for name, items in docs.items():
        text = (KUBERAY / name).read_text()
        assert "LoadBalancer" not in text and "NodePort" not in text, name
        for doc in items:
            if doc.get("kind") == "Service":
                assert doc["spec"].get("type", "ClusterIP") == "ClusterIP"
    (cluster,) = docs["raycluster.yaml"]
    spec = cluster["spec"]
    assert spec["headGroupSpec"]["serviceType"] == "ClusterIP"
    assert spec["authOptions"] == {"mode": "token"}
    assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    ports = spec["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"]
    assert all("hostPort" not in p for p in ports)


def _pod_templates(cluster_spec: dict) -> list[dict]:
    groups = [cluster_spec["headGroupSpec"], *cluster_spec["workerGroupSpecs"]]
    return [g["template"] for g in groups]


def test_kuberay_network_policy_admits_only_the_clusters_own_pods():
    docs = kuberay_docs()
    (policy,) = docs["networkpolicy.yaml"]
    assert policy["apiVersion"] == "networking.k8s.io/v1" and policy["kind"] == "NetworkPolicy"
    spec = policy["spec"]
    assert "Ingress" in spec["policyTypes"]
    selected = spec["podSelector"]["matchLabels"]
    assert selected, "an empty podSelector would select every pod of the namespace"
    # Every Ray pod of raycluster.yaml and of the cluster rayjob.yaml creates is selected.
    (cluster,) = docs["raycluster.yaml"]
    (job,) = docs["rayjob.yaml"]
    for template in _pod_templates(cluster["spec"]) + _pod_templates(job["spec"]["rayClusterSpec"]):
        labels = template.get("metadata", {}).get("labels", {})
        assert selected.items() <= labels.items(), labels
    own_pods, *others = spec["ingress"]
    # Rule 1: from this cluster's pods only (no namespace-wide or IP-range peers).
    assert own_pods["from"] == [{"podSelector": {"matchLabels": selected}}]
    # Every other rule: a named peer (never "from anywhere"), the dashboard port only.
    head_ports = {
        p["containerPort"]
        for p in cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"]
    }
    assert {6379, 8265, 10001} <= head_ports
    for rule in others:
        assert rule.get("from"), "a rule without 'from' admits every source"
        for peer in rule["from"]:
            assert "ipBlock" not in peer
            assert peer.get("podSelector", {}).get("matchLabels"), peer
        assert [p["port"] for p in rule["ports"]] == [8265]
    # RayJob submits over HTTP from the operator: no submitter pod outside the policy.
    assert job["spec"]["submissionMode"] == "HTTPMode"


def test_node_tags_agree_across_launcher_kuberay_and_example_job():
    launcher = launcher_config()
    launcher_pools = {
        t["labels"]["pool"]: t["resources"]
        for n, t in launcher["available_node_types"].items()
        if n != launcher["head_node_type"]
    }
    (cluster,) = kuberay_docs()["raycluster.yaml"]
    kuberay_pools = {g["labels"]["pool"] for g in cluster["spec"]["workerGroupSpecs"]}
    job_pools = {s.label_selector["pool"] for s in load_config(CLUSTER_JOB).workers}
    assert set(launcher_pools) == kuberay_pools == job_pools
    # The same hardware kind per pool: GPU pools have GPUs in both deployments.
    kuberay_gpu = {
        g["labels"]["pool"]: int(g["rayStartParams"]["num-gpus"]) > 0
        for g in cluster["spec"]["workerGroupSpecs"]
    }
    assert {p: r.get("GPU", 0) > 0 for p, r in launcher_pools.items()} == kuberay_gpu


# ----------------------------------------------------------------------------- S3 storage

#: What a secret in a deploy file would look like (an AWS key id, a secret key setting).
_SECRET = re.compile(
    r"AKIA[0-9A-Z]{16}|aws_secret_access_key|AWS_SECRET_ACCESS_KEY:|secret_key", re.I
)


def _without_comments(path: Path) -> str:
    """The file's YAML without its comments (which may name the variables keys go in)."""
    return re.sub(r"(^|\s)#.*", "", path.read_text())


def test_aws_s3_variant_validates_and_reaches_s3_by_instance_profile_only():
    import jsonschema
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = load_yaml(AWS_S3_YAML)
    jsonschema.validate(config, json.loads(RAY_SCHEMA.read_text()))
    validate_config(prepare_config(copy.deepcopy(config)))
    base = launcher_config()
    # The same node types and safe defaults as deploy/cluster.yaml ...
    for name, node_type in config["available_node_types"].items():
        plain = base["available_node_types"][name]
        assert {k: v for k, v in node_type.items() if k != "node_config"} == {
            k: v for k, v in plain.items() if k != "node_config"
        }
        # ... every node with an IAM instance profile (no keys), and no shared file system.
        assert node_type["node_config"]["IamInstanceProfile"]["Arn"].startswith("arn:aws:iam::")
    for key in ("head_start_ray_commands", "worker_start_ray_commands", "file_mounts", "provider"):
        assert config[key] == base[key], key
    text = AWS_S3_YAML.read_text()
    assert "/mnt/shared" not in text and "efs" not in text.lower().replace("efault", "")
    assert not _SECRET.search(_without_comments(AWS_S3_YAML))
    assert config["docker"]["run_options"] == [
        o for o in base["docker"]["run_options"] if "/mnt/shared" not in o
    ]
    # The example job it runs keeps checkpoints and outputs in S3 and fits its node types.
    job = load_config(S3_JOB)
    assert str(job.ray.storage_path).startswith("s3://") and str(job.output_dir).startswith("s3://")
    assert job.ray.storage_filesystem is None  # the instance role and AWS's own endpoint
    assert job.data.root.as_posix() in text  # setup_commands download the data it reads
    assert_job_fits(job, config["available_node_types"], config["head_node_type"])
    policy = json.loads((DEPLOY / "aws" / "s3-policy.json").read_text())
    actions = {a for statement in policy["Statement"] for a in statement["Action"]}
    assert {"s3:ListBucket", "s3:GetObject", "s3:PutObject", "s3:DeleteObject"} <= actions


def test_kuberay_s3_variant_is_rayjob_plus_irsa_and_no_keys():
    (account, job) = kuberay_docs()["rayjob-s3.yaml"]
    (plain,) = kuberay_docs()["rayjob.yaml"]
    assert account["kind"] == "ServiceAccount"
    assert account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].startswith(
        "arn:aws:iam::"
    )
    # rayjob.yaml's cluster, every pod running as that ServiceAccount (IRSA), nothing else.
    expected = copy.deepcopy(plain["spec"]["rayClusterSpec"])
    for template in _pod_templates(expected):
        template["spec"]["serviceAccountName"] = account["metadata"]["name"]
    assert job["spec"]["rayClusterSpec"] == expected
    assert not _SECRET.search(_without_comments(KUBERAY / "rayjob-s3.yaml"))
    argv = shlex.split(job["spec"]["entrypoint"])
    sets = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--set")
    assert sets["ray.storage_path"].startswith("s3://") and sets["output_dir"].startswith("s3://")
    config = REPO / argv[argv.index("--config") + 1].removeprefix("/home/ray/raytrain_hetero/")
    from raytrain_hetero.app.config import parse_overrides

    job_config = load_config(config, parse_overrides([f"{k}={v}" for k, v in sets.items()]))
    assert str(job_config.ray.storage_path) == sets["ray.storage_path"]


# ----------------------------------------------------------------------------- local


def test_local_cluster_default_pools_fit_the_local_cluster_example():
    lc = load_local_cluster()
    job = load_config(LOCAL_CLUSTER_JOB)
    node_types = {"head": {"resources": {"CPU": 0, "GPU": 0}, "labels": {}, "max_workers": 0}}
    for name, (cpus, gpus) in lc.DEFAULT_POOLS.items():
        node_types[name] = {
            "resources": {"CPU": cpus, "GPU": gpus},
            "labels": {lc.POOL_LABEL: name},
            "max_workers": 1,
        }
    assert_job_fits(job, node_types, "head")
    assert job.ray.address == "auto"


def test_local_cluster_command_line_and_pool_parsing():
    lc = load_local_cluster()
    assert lc.parse_pool("gpu:4:1") == ("gpu", 4.0, 1)
    assert lc.parse_pool("fast:2") == ("fast", 2.0, 0)
    with pytest.raises(Exception, match="NAME:CPUS"):
        lc.parse_pool("fast")
    code = (DEPLOY / "local" / "local_cluster.py").read_text()
    assert "start_new_session=True" in code and "--dashboard-host=127.0.0.1" in code
    # The only Ray command it runs is `ray start --block` (never `ray stop`).
    assert re.findall(r'\[_ray_executable\(\), "([\w-]+)"', code) == ["start"]


# ----------------------------------------------------------------------------- Docker


def _pins(requirements: list[str]) -> dict[str, tuple[str, frozenset[str]]]:
    pins = {}
    for req in requirements:
        match = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)(?:\[([^\]]*)\])?\s*==\s*([^\s;]+)\s*", req)
        if match:
            name = re.sub(r"[-_.]+", "-", match[1]).lower()
            extras = frozenset(e.strip() for e in (match[2] or "").split(",") if e.strip())
            pins[name] = (match[3], extras)
    return pins


def test_dockerfile_pins_agree_with_pyproject():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = _pins(project["dependencies"])
    assert {"torch", "torchvision", "ray", "torchgeo"} <= set(wanted)
    dockerfile = (REPO / "Dockerfile").read_text()
    installed = _pins(re.findall(r'"([^"]+==[^"]+)"', dockerfile))
    assert set(installed) == set(wanted), "a pin is missing on one side"
    for name, (version, extras) in wanted.items():
        assert installed[name][0] == version, (
            f"{name}: Dockerfile {installed[name][0]} vs pyproject {version}"
        )
        assert extras <= installed[name][1], (
            f"{name}: Dockerfile lacks extras {extras - installed[name][1]}"
        )
    # The base image is the pinned Ray release, on a Python the package supports.
    base = re.search(r"^FROM\s+rayproject/ray:(\S+)", dockerfile, re.M)[1]
    ray_version, py_major, py_minor = re.match(r"([\d.]+)-py(\d)(\d+)", base).groups()
    assert ray_version == wanted["ray"][0] == ray.__version__
    minimum = tuple(
        int(x) for x in re.search(r">=\s*([\d.]+)", project["requires-python"])[1].split(".")
    )
    assert (int(py_major), int(py_minor)) >= minimum
    # GPU variant by build argument, and the package itself installed from the copied source.
    assert re.search(r"^ARG RAY_IMAGE_SUFFIX=", dockerfile, re.M)
    assert "${RAY_IMAGE_SUFFIX}" in base
    assert re.search(r"pip install --no-cache-dir \.", dockerfile)
    assert re.search(r"^COPY .*examples", dockerfile, re.M)


def test_dockerignore_keeps_data_and_secrets_out_of_the_image():
    ignored = {
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", "data", "outputs", "**/ray_results", "tests"} <= ignored
    assert "raytrain_hetero" not in ignored and "examples" not in ignored


# ----------------------------------------------------------------------------- safe defaults


def test_checkpoints_are_loaded_with_weights_only():
    """Every ``torch.load`` in the package and scripts refuses pickled code."""
    import ast

    calls = []
    for path in [*(REPO / "raytrain_hetero").rglob("*.py"), *(REPO / "scripts").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "load"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "torch"
            ):
                safe = any(
                    k.arg == "weights_only"
                    and isinstance(k.value, ast.Constant)
                    and k.value.value is True
                    for k in node.keywords
                )
                calls.append((f"{path.relative_to(REPO)}:{node.lineno}", safe))
    assert calls, "no torch.load found: the check would be vacuous"
    assert [where for where, safe in calls if not safe] == []


# What the embedded local Ray binds is checked on a running Ray, socket by socket, in
# test_network_exposure.py (a check of RayConfig.dashboard_host here could not fail: the
# embedded Ray starts no dashboard).


# ----------------------------------------------------------------------------- local: private state


def test_local_cluster_default_state_dir_is_per_user(monkeypatch, tmp_path):
    import os

    lc = load_local_cluster()
    monkeypatch.delenv(lc.STATE_DIR_ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert lc.default_state_dir() == tmp_path / "rh-cluster"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert lc.default_state_dir().name == f"rh-cluster-{os.getuid()}"
    created = lc.secure_state_dir(tmp_path / "fresh")
    assert created.stat().st_mode & 0o777 == 0o700


def test_local_cluster_refuses_a_state_dir_others_could_have_planted(tmp_path):
    import os

    lc = load_local_cluster()
    open_dir = tmp_path / "world-writable"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "private", target_is_directory=True)
    (tmp_path / "private").mkdir(mode=0o700)
    refused = {open_dir: "mode 0777", link: "symbolic link"}
    if os.getuid() == 0:  # root can hand a directory to another user to stand for one
        foreign = tmp_path / "foreign"
        foreign.mkdir(mode=0o700)
        os.chown(foreign, 65534, 65534)
        refused[foreign] = "owned by uid 65534"
    for path, reason in refused.items():
        cluster = lc.LocalCluster(path)
        with pytest.raises(lc.ClusterStateError, match=reason):
            cluster.start_head()
        assert cluster.nodes == [] and not (path / "auth_token").exists(), path
        with pytest.raises(lc.ClusterStateError):
            lc.LocalCluster.load(path)
        assert lc.main(["status", "--state-dir", str(path)]) == 2
    assert lc.main(["stop", "--state-dir", str(open_dir)]) == 2


def test_local_cluster_refuses_a_token_it_did_not_write(tmp_path):
    lc = load_local_cluster()
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    planted = state / "auth_token"
    planted.write_text("0" * 64)
    planted.chmod(0o600)
    cluster = lc.LocalCluster(state)
    with pytest.raises(lc.ClusterStateError, match="not written by this tool"):
        cluster.start_head()
    assert cluster.nodes == [] and planted.read_text() == "0" * 64
    # A token the tool wrote itself (digest recorded) is reused.
    own = lc.LocalCluster(tmp_path / "own")
    own.state_dir = lc.secure_state_dir(own.state_dir)
    own._ensure_token()
    token = own.token_path.read_text()
    assert own.token_path.stat().st_mode & 0o777 == 0o600
    again = lc.LocalCluster.load(own.state_dir)
    again._ensure_token()
    assert again.token_path.read_text() == token


def test_local_cluster_stop_signals_only_recorded_processes_that_are_still_its_own(tmp_path):
    """No Ray needed: a recorded node is a plain process group here."""
    lc = load_local_cluster()
    state = lc.secure_state_dir(tmp_path / "state")
    bystander = start_bystander(str(state / "ray"))  # names the cluster's temp dir: must survive
    recorded = start_bystander()
    try:
        ours = lc.proc_stat(recorded.pid)
        reused = lc.NodeProcess("head", bystander.pid, bystander.pid, "log", start_ticks=1)
        node = lc.NodeProcess("pool", recorded.pid, recorded.pid, "log")
        node.start_ticks = ours.start_ticks
        cluster = lc.LocalCluster(state, nodes=[reused, node])
        assert cluster.cluster_pids() == [recorded.pid]  # the stale record matches nothing
        cluster.stop(grace_s=10)
        assert recorded.wait(timeout=10) is not None
        assert bystander.poll() is None, "stop ended a process it did not start"
        assert cluster.cluster_pids() == []
    finally:
        end_process(bystander)
        if recorded.poll() is None:
            end_process(recorded)
