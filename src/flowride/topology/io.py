"""Topologies as JSON (schema ``flowride.topology/1``).

{"schema": "flowride.topology/1", "name": "...", "nominal_gpus": null,
 "nodes": [{"id": 0, "kind": "gpu", "group": 0}, {"id": 8, "kind": "switch", "copy": false}],
 "links": [{"src": 0, "dst": 1, "bandwidth_GBps": 50, "alpha_us": 0.7}]}

Links are directed; ``alpha_us`` is the latency in microseconds (default 0).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flowride.errors import InputError
from flowride.files import read_json, write_json_atomic
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
        "nodes": nodes,
        "links": links,
    }


def _field(obj: dict, key: str, where: str, kind: type | tuple, default: Any = ...) -> Any:
    if key not in obj:
        if default is ...:
            raise InputError(f"{where}.{key}", "is missing", "add it (see docs/topology-json.md)")
        return default
    val = obj[key]
    if isinstance(val, bool) and kind is not bool and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise InputError(f"{where}.{key}", f"{val!r} has the wrong type", f"expected {kind}")
    if not isinstance(val, kind):
        raise InputError(f"{where}.{key}", f"{val!r} has the wrong type", f"expected {getattr(kind, '__name__', kind)}")
    return val


def _switch_copy(rn: dict, where: str) -> bool:
    """A switch must say whether it replicates: the answer changes what a schedule may do."""
    if rn.get("kind", "gpu") != "switch":
        return True
    if "copy" not in rn:
        raise InputError(f"{where}.copy", "is missing: say whether this switch can replicate a chunk onto several links",
                         "true for a multicast-capable switch (NVLink SHARP / NVLS), false for one that forwards "
                         "(NVSwitch gen 1-2, InfiniBand); --switch-copy on|off sets every switch")
    return _field(rn, "copy", where, bool)


def topology_from_dict(data: Any) -> Topology:
    if not isinstance(data, dict):
        raise InputError("topology", "the JSON is not an object", "see examples/ for the schema")
    schema = data.get("schema", SCHEMA)
    if schema != SCHEMA:
        raise InputError("schema", f"{schema!r} is not supported", f"use {SCHEMA!r}")
    raw_nodes = _field(data, "nodes", "topology", list)
    raw_links = _field(data, "links", "topology", list)
    nodes = []
    for i, rn in enumerate(raw_nodes):
        where = f"nodes[{i}]"
        if not isinstance(rn, dict):
            raise InputError(where, "is not an object", 'write {"id": 0, "kind": "gpu"}')
        nodes.append(
            Node(
                id=_field(rn, "id", where, int),
                kind=_field(rn, "kind", where, str, "gpu"),
                copy=_switch_copy(rn, where),
                group=_field(rn, "group", where, (int, type(None)), None),
                label=_field(rn, "label", where, str, ""),
            )
        )
    nodes.sort(key=lambda n: n.id)
    links = []
    for i, rl in enumerate(raw_links):
        where = f"links[{i}]"
        if not isinstance(rl, dict):
            raise InputError(where, "is not an object", 'write {"src": 0, "dst": 1, "bandwidth_GBps": 50}')
        links.append(
            Link(
                src=_field(rl, "src", where, int),
                dst=_field(rl, "dst", where, int),
                bandwidth_GBps=float(_field(rl, "bandwidth_GBps", where, (int, float))),
                alpha_s=float(_field(rl, "alpha_us", where, (int, float), 0.0)) * 1e-6,
            )
        )
    return Topology(
        name=_field(data, "name", "topology", str, "custom"),
        nodes=tuple(nodes),
        links=tuple(links),
        nominal_gpus=_field(data, "nominal_gpus", "topology", (int, type(None)), None),
        description=_field(data, "description", "topology", str, ""),
        teccl_compat=_field(data, "teccl_compat", "topology", bool, False),
    )


def save_topology(topo: Topology, path: str | Path) -> None:
    write_json_atomic(path, topology_to_dict(topo), indent=1)


def load_topology(path: str | Path) -> Topology:
    return topology_from_dict(read_json(path, "topology", "give an existing topology JSON file"))
