"""Topologies as JSON (schema ``flowride.topology/1``).

{"schema": "flowride.topology/1", "name": "...", "nominal_gpus": null,
 "nodes": [{"id": 0, "kind": "gpu", "group": 0}, {"id": 8, "kind": "switch", "copy": false}],
 "links": [{"src": 0, "dst": 1, "bandwidth_GBps": 50, "alpha_us": 0.7}]}

Links are directed; ``alpha_us`` is the latency in microseconds (default 0). Every key is
checked against the schema below: an unknown key (say ``alpha_ns``) is an error listing the
known ones, never silently ignored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from flowride.errors import InputError
from flowride.files import read_json, write_json_atomic
from flowride.schema import Strict, validated
from flowride.sizes import MAX_LINKS, MAX_NODES
from flowride.topology.model import Link, Node, Topology

SCHEMA = "flowride.topology/1"


def topology_to_dict(topo: Topology) -> dict[str, Any]:
    nodes = []
    for nd in topo.nodes:
        d: dict[str, Any] = {"id": nd.id, "kind": nd.kind}
        if not nd.is_gpu:
            d["copy"] = nd.copy
        if nd.group is not None:
            d["group"] = nd.group
        if nd.label:
            d["label"] = nd.label
        nodes.append(d)
    links = [
        {"src": lk.src, "dst": lk.dst, "bandwidth_GBps": lk.bandwidth_GBps, "alpha_us": round(lk.alpha_s * 1e6, 9)}
        for lk in topo.links
    ]
    return {
        "schema": SCHEMA,
        "name": topo.name,
        "description": topo.description,
        "nominal_gpus": topo.nominal_gpus,
        "teccl_compat": topo.teccl_compat,
        "switching": topo.switching,
        "nodes": nodes,
        "links": links,
    }


class _NodeSpec(Strict):
    id: int
    kind: Literal["gpu", "switch"] = "gpu"
    copy_: bool | None = Field(None, alias="copy")  # required for a switch (checked below, with the reason)
    group: int | None = None
    label: str = Field("", max_length=200)


class _LinkSpec(Strict):
    src: int
    dst: int
    bandwidth_GBps: float
    alpha_us: float = 0.0


class _TopologySpec(Strict):
    schema_: str = Field(SCHEMA, alias="schema")
    name: str = Field("custom", max_length=200)
    description: str = Field("", max_length=10_000)
    nominal_gpus: int | None = None
    teccl_compat: bool = False
    switching: Literal["cut-through", "store-and-forward"] = "cut-through"
    nodes: list[_NodeSpec] = Field(max_length=MAX_NODES)
    links: list[_LinkSpec] = Field(max_length=MAX_LINKS)


def topology_from_dict(data: Any) -> Topology:
    """A Topology from its JSON form; every key checked (unknown keys are errors), then the
    physical rules (ranges, reachability) by :class:`Topology` itself."""
    if not isinstance(data, dict):
        raise InputError("topology", "the JSON is not an object", "see examples/ for the schema")
    schema = data.get("schema", SCHEMA)
    if schema != SCHEMA:
        raise InputError("schema", f"{schema!r} is not supported", f"use {SCHEMA!r}")
    if "fabric" in data:  # a cluster described by its parts (topology/fabrics.py), built here
        from dataclasses import replace

        from flowride.topology.fabrics import fabric_from_dict

        extra = sorted(set(data) - {"schema", "name", "description", "fabric", "switching"})
        if extra:
            raise InputError(f"topology.{extra[0]}", "does not go with a fabric", "give nodes and links, or a fabric, not both")
        topo = fabric_from_dict(data["fabric"])
        switching = data.get("switching", "cut-through")
        if switching not in ("cut-through", "store-and-forward"):
            raise InputError("switching", f"{switching!r} is not a switching model", "use cut-through or store-and-forward")
        for key in ("name", "description"):
            if key in data and not isinstance(data[key], str):
                raise InputError(key, f"{data[key]!r} is not text", "give a string")
        return replace(topo, name=data.get("name", topo.name)[:200], description=data.get("description", topo.description)[:10_000],
                       switching=switching)
    spec = validated(_TopologySpec, data, "topology", "see docs/topology-json.md")
    for i, rn in enumerate(spec.nodes):
        if rn.kind == "switch" and rn.copy_ is None:
            raise InputError(f"nodes[{i}].copy", "is missing: say whether this switch can replicate a chunk onto several links",
                             "true for a multicast-capable switch (NVLink SHARP / NVLS), false for one that forwards "
                             "(NVSwitch gen 1-2, InfiniBand); --switch-copy on|off sets every switch")
    nodes = sorted((Node(id=rn.id, kind=rn.kind, copy=True if rn.copy_ is None else rn.copy_, group=rn.group, label=rn.label)
                    for rn in spec.nodes), key=lambda n: n.id)
    links = [Link(src=rl.src, dst=rl.dst, bandwidth_GBps=float(rl.bandwidth_GBps), alpha_s=float(rl.alpha_us) * 1e-6)
             for rl in spec.links]
    return Topology(name=spec.name, nodes=tuple(nodes), links=tuple(links), nominal_gpus=spec.nominal_gpus,
                    description=spec.description, teccl_compat=spec.teccl_compat, switching=spec.switching)


def save_topology(topo: Topology, path: str | Path) -> None:
    write_json_atomic(path, topology_to_dict(topo), indent=1)


def load_topology(path: str | Path) -> Topology:
    try:
        data = read_json(path, "topology", "give an existing topology JSON file")
    except InputError as e:
        hint = _import_hint(path) if "not valid JSON" in e.problem else None
        if hint is None:
            raise
        raise InputError("topology", f"{path} is not topology JSON: it looks like {hint[0]}", f"import it with {hint[1]} {path}") from None
    return topology_from_dict(data)


def _import_hint(path: str | Path) -> tuple[str, str] | None:
    """What a file that is not JSON looks like, where an importer reads it: an ``nvidia-smi topo -m``
    matrix, an NCCL topology XML dump or ``rocm-smi --showtopo`` text (read as text, the first 64 KiB)."""
    try:
        with open(path, errors="replace") as f:
            head = f.read(65536)
    except OSError:
        return None
    if "<system" in head or head.lstrip().startswith("<?xml"):
        return "an NCCL topology XML dump", "--from-nccl-xml"
    if "Link Type between two GPUs" in head or "Weight between two GPUs" in head or "ROCm System Management Interface" in head:
        return "rocm-smi --showtopo output", "--from-rocm-smi"
    if "GPU0" in head and (" X " in head or "\tX\t" in head or "Legend" in head):
        return "an nvidia-smi topo -m matrix", "--from-nvidia-smi"
    return None
