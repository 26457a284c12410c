"""Data shipped for the rent planner: a small price snapshot and published throughput figures.

**Prices** (:data:`VMS_SNAPSHOT_CSV`, :func:`snapshot_catalog`): a handful of AWS rows in
SkyPilot's catalog format (``vms.csv``, format version 8; the format and the numbers come from
``skypilot-org/skypilot-catalog``, ``catalogs/v8/aws/vms.csv`` at commit
``00148f2af3672e2229b4f7bf8157d5a3f36e3c35``). A **snapshot**: spot prices move hourly and
on-demand prices change too; use a current catalog (your own ``vms.csv``) for real decisions.
Kept: nine instance types in us-east-1 and us-west-2, every regular zone the catalog listed
for them there (Local Zones such as ``use1-atl2-az1`` left out), the ``GpuInfo`` column left
empty; one ``mac1.metal`` row without a price, as the catalog has it (a real-world example of
a row the planner refuses to rent).

**Published figures** (:data:`PUBLISHED_FIGURES`): per-GPU ResNet-50 training throughput, in
images per second, for pricing a type that was never measured (flagged as an estimate):

* NVIDIA DeepLearningExamples, PyTorch ResNet-50 v1.5 (container pytorch-21.03), training
  performance tables: A100-80GB 938 (TF32) / 2,470 (AMP); V100-16GB 367 (FP32) / 1,200
  (AMP); 8 x V100-16GB 2,855 (FP32) / 7,248 (AMP).
* Lambda's GPU benchmarks (ResNet-50, PyTorch, synthetic data), AMP / TF32: V100 833 / 369,
  A10 638 / 349, A100-40GB 1,396 / 882, H100 SXM 2,616 / 1,753, H200 3,079 / 2,259.
"""

from __future__ import annotations

from dataclasses import dataclass

from raytrain_hetero.core.rent_catalog import PriceCatalog, parse_vms_csv
from raytrain_hetero.errors import ConfigError

__all__ = [
    "PUBLISHED_FIGURES",
    "SNAPSHOT_SOURCE",
    "VMS_SNAPSHOT_CSV",
    "PublishedFigure",
    "published_figure",
    "snapshot_catalog",
]

SNAPSHOT_SOURCE = (
    "built-in snapshot of skypilot-org/skypilot-catalog catalogs/v8/aws/vms.csv (commit 00148f2a)"
)

_HEADER = (
    "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,"
    "Region,AvailabilityZone,Arch"
)

# (type, accelerator, count, vCPUs, GiB, on-demand $/h, {region: [(zone, spot $/h or "")]})
_ROWS: tuple[tuple[str, str, str, str, str, str, dict[str, list[tuple[str, str]]]], ...] = (
    (
        "g5.xlarge", "A10G", "1.0", "4.0", "16.0", "1.006",
        {
            "us-east-1": [("use1-az1", "0.450700"), ("use1-az2", "0.424600"),
                          ("use1-az4", "0.436000"), ("use1-az5", "0.425900"),
                          ("use1-az6", "0.436400")],
            "us-west-2": [("usw2-az1", "0.485700"), ("usw2-az2", "0.513400"),
                          ("usw2-az3", "0.482900")],
        },
    ),
    (
        "g6.xlarge", "L4", "1.0", "4.0", "16.0", "0.8048",
        {
            "us-east-1": [("use1-az1", "0.401100"), ("use1-az2", "0.365300"),
                          ("use1-az4", "0.349000"), ("use1-az6", "0.398800")],
            "us-west-2": [("usw2-az1", "0.425000"), ("usw2-az2", "0.453700"),
                          ("usw2-az3", "0.390000"), ("usw2-az4", "0.454100")],
        },
    ),
    (
        "p3.2xlarge", "V100", "1.0", "8.0", "61.0", "3.06",
        {
            "us-east-1": [("use1-az1", "0.370700"), ("use1-az2", "0.428100"), ("use1-az3", ""),
                          ("use1-az4", ""), ("use1-az5", "0.404100"), ("use1-az6", "0.384100")],
            "us-west-2": [("usw2-az1", "0.659800"), ("usw2-az2", "0.541500"),
                          ("usw2-az3", "0.534900")],
        },
    ),
    (
        "p3.8xlarge", "V100", "4.0", "32.0", "244.0", "12.24",
        {
            "us-east-1": [("use1-az1", "1.442700"), ("use1-az2", "1.513200"), ("use1-az3", ""),
                          ("use1-az4", ""), ("use1-az5", "1.412900"), ("use1-az6", "1.476200")],
            "us-west-2": [("usw2-az1", "2.937200"), ("usw2-az2", "3.079400"),
                          ("usw2-az3", "2.747500")],
        },
    ),
    (
        "p4d.24xlarge", "A100", "8.0", "96.0", "1152.0", "21.957642",
        {
            "us-east-1": [("use1-az1", "2.465500"), ("use1-az2", "8.191500"),
                          ("use1-az4", "8.120300"), ("use1-az6", "7.879900")],
            "us-west-2": [("usw2-az1", "7.999200"), ("usw2-az2", "8.225900"),
                          ("usw2-az3", "9.731500"), ("usw2-az4", "8.479400")],
        },
    ),
    (
        "p4de.24xlarge", "A100-80GB", "8.0", "96.0", "1152.0", "27.44705",
        {
            "us-east-1": [("use1-az4", "9.973400"), ("use1-az6", "8.650500")],
            "us-west-2": [("usw2-az1", "10.999100"), ("usw2-az2", "11.014400"),
                          ("usw2-az3", "10.333800")],
        },
    ),
    (
        "p5.48xlarge", "H100", "8.0", "192.0", "2048.0", "55.04",
        {
            "us-east-1": [("use1-az1", "55.040000"), ("use1-az2", "19.253100"),
                          ("use1-az3", "21.154300"), ("use1-az4", "55.040000"),
                          ("use1-az5", "25.752200"), ("use1-az6", "17.628900")],
            "us-west-2": [("usw2-az1", "12.693500"), ("usw2-az2", "12.978500"),
                          ("usw2-az3", "12.972700")],
        },
    ),
    (
        "m8i.xlarge", "", "", "4.0", "16.0", "0.21168",
        {
            "us-east-1": [("use1-az2", "0.095800"), ("use1-az4", "0.107000"),
                          ("use1-az6", "0.091200")],
            "us-west-2": [("usw2-az1", "0.082400"), ("usw2-az2", "0.079900"),
                          ("usw2-az3", "0.089800"), ("usw2-az4", "0.076700")],
        },
    ),
)  # fmt: skip


def _snapshot_text() -> str:
    lines = [_HEADER]
    for name, accelerator, count, vcpus, memory, price, regions in _ROWS:
        arch = "x86_64"
        for region, zones in regions.items():
            for zone, spot in zones:
                lines.append(
                    f"{name},{accelerator},{count},{vcpus},{memory},,{price},{spot},"
                    f"{region},{zone},{arch}"
                )
    # As the catalog lists it: a type with no price at all.
    lines.append("mac1.metal,,,12.0,32.0,,,,us-east-1,use1-az4,x86_64_mac")
    return "\n".join(lines) + "\n"


#: The snapshot as the text of a vms.csv (v8 columns).
VMS_SNAPSHOT_CSV: str = _snapshot_text()


def snapshot_catalog() -> PriceCatalog:
    """The built-in price snapshot, parsed (see the module docstring: a snapshot)."""
    return parse_vms_csv(VMS_SNAPSHOT_CSV, SNAPSHOT_SOURCE)


@dataclass(frozen=True)
class PublishedFigure:
    """One published per-GPU training throughput.

    Attributes:
        name: Its key, ``"<table>/<gpu>"``, e.g. ``"lambda-resnet50-amp/A10"``.
        accelerator: The GPU it was measured on.
        samples_per_s: Images per second per GPU.
        source: Where it is published.
    """

    name: str
    accelerator: str
    samples_per_s: float
    source: str


_NVIDIA = (
    "NVIDIA DeepLearningExamples, PyTorch ResNet-50 v1.5 (pytorch-21.03), training performance"
)
_LAMBDA = "Lambda GPU benchmarks, ResNet-50 (PyTorch, synthetic data)"

PUBLISHED_FIGURES: dict[str, PublishedFigure] = {
    f.name: f
    for f in (
        PublishedFigure("nvidia-resnet50-tf32/A100-80GB", "A100-80GB", 938.0, _NVIDIA + ", TF32"),
        PublishedFigure("nvidia-resnet50-amp/A100-80GB", "A100-80GB", 2470.0, _NVIDIA + ", AMP"),
        PublishedFigure("nvidia-resnet50-fp32/V100", "V100", 367.0, _NVIDIA + ", FP32"),
        PublishedFigure("nvidia-resnet50-amp/V100", "V100", 1200.0, _NVIDIA + ", AMP"),
        PublishedFigure("lambda-resnet50-amp/V100", "V100", 833.0, _LAMBDA + ", AMP"),
        PublishedFigure("lambda-resnet50-tf32/V100", "V100", 369.0, _LAMBDA + ", TF32/FP32"),
        PublishedFigure("lambda-resnet50-amp/A10", "A10", 638.0, _LAMBDA + ", AMP"),
        PublishedFigure("lambda-resnet50-tf32/A10", "A10", 349.0, _LAMBDA + ", TF32"),
        PublishedFigure("lambda-resnet50-amp/A100-40GB", "A100-40GB", 1396.0, _LAMBDA + ", AMP"),
        PublishedFigure("lambda-resnet50-tf32/A100-40GB", "A100-40GB", 882.0, _LAMBDA + ", TF32"),
        PublishedFigure("lambda-resnet50-amp/H100-SXM", "H100-SXM", 2616.0, _LAMBDA + ", AMP"),
        PublishedFigure("lambda-resnet50-tf32/H100-SXM", "H100-SXM", 1753.0, _LAMBDA + ", TF32"),
        PublishedFigure("lambda-resnet50-amp/H200", "H200", 3079.0, _LAMBDA + ", AMP"),
        PublishedFigure("lambda-resnet50-tf32/H200", "H200", 2259.0, _LAMBDA + ", TF32"),
    )
}


def published_figure(name: str) -> PublishedFigure:
    """The figure called ``name``.

    Raises:
        ConfigError: No such figure (naming the known ones).
    """
    if name not in PUBLISHED_FIGURES:
        raise ConfigError(
            f"no published figure {name!r}. Fix: use one of {', '.join(sorted(PUBLISHED_FIGURES))}, "
            "or give samples_per_s and its source yourself."
        )
    return PUBLISHED_FIGURES[name]
