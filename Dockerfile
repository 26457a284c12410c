# syntax=docker/dockerfile:1
# raytrain_hetero on the official Ray image (Python 3.11), CPU variant by default:
#   docker build -t raytrain-hetero:0.1.0 .
# GPU variant (CUDA base image; torch's PyPI wheels carry CUDA):
#   docker build --build-arg RAY_IMAGE_SUFFIX=-gpu -t raytrain-hetero:0.1.0-gpu .
# Used by deploy/cluster.yaml (AWS) and deploy/kuberay/*.yaml (Kubernetes).
ARG RAY_IMAGE_SUFFIX=""
FROM rayproject/ray:2.60.0-py311${RAY_IMAGE_SUFFIX}

# The pins of pyproject.toml (tests/test_deploy.py checks that they agree), in their own
# layer so that code changes do not reinstall torch. ray[default] (dashboard, Jobs API) is
# part of the base image; the pin keeps it at the base image's version.
RUN pip install --no-cache-dir \
        "ray[default,train,tune]==2.60.0" \
        "torch==2.15.0" \
        "torchvision==0.29.2" \
        "torchgeo==0.8.1"

WORKDIR /home/ray/raytrain_hetero
# README.md* : the package metadata names README.md; the glob keeps the build working without it.
COPY --chown=ray:users pyproject.toml README.md* ./
COPY --chown=ray:users raytrain_hetero ./raytrain_hetero
# Example configs, referenced by deploy/kuberay/rayjob.yaml.
COPY --chown=ray:users examples ./examples
RUN pip install --no-cache-dir . \
    && raytrain-hetero --help > /dev/null \
    && python -c "import raytrain_hetero, torch, torchgeo, ray; assert ray.__version__ == '2.60.0'"

# Nothing is started here: deployments run `ray start` (head or worker) themselves, with
# RAY_AUTH_MODE=token and the dashboard on 127.0.0.1 (cluster launcher) or a ClusterIP
# Service (KubeRay).
