"""A calibration profile: what ``flowride calibrate`` learned of one cluster from its own
nccl-tests logs, as a JSON file every pricing command takes (``--calibration FILE``).

It keeps the fitted :class:`Calibration`, the cluster it was fitted on (node type, nodes, NICs,
network kind), the logs behind it, and the fit per size (predicted against measured), so a
report that uses it can state the model's error at each size."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from flowride.errors import InputError
from flowride.files import read_json, write_json_atomic
from flowride.runtime.nccl_tuning import Calibration

SCHEMA = "flowride.calibration/1"


@dataclass(frozen=True)
class Profile:
    calibration: Calibration
    cluster: dict  # node, nodes, nics, nic_Gbps, network_kind, ranks
    fitted_on: tuple[str, ...]  # the logs (file names) the fit read
    fields_fitted: tuple[str, ...]
    fit: list[dict] = field(default_factory=list)  # per point: collective, bytes, measured_us, predicted_us, ratio
    summary: dict = field(default_factory=dict)  # median errors, worst ratio

    def to_dict(self) -> dict:
        cal = {k: v for k, v in asdict(self.calibration).items() if v is not None}
        return {"schema": SCHEMA, "calibration": cal, "cluster": self.cluster, "fitted_on": list(self.fitted_on),
                "fields_fitted": list(self.fields_fitted), "summary": self.summary, "fit": self.fit}


def calibration_from_dict(d: dict, where: str = "calibration") -> Calibration:
    """A Calibration from its JSON fields; unknown fields and non-numbers refused by name."""
    names = {f.name for f in fields(Calibration)}
    if not isinstance(d, dict):
        raise InputError(where, "not an object", f"give an object with fields among {', '.join(sorted(names))}")
    bad = sorted(set(d) - names)
    if bad:
        raise InputError(f"{where}.{bad[0]}", "not a calibration field", f"fields are {', '.join(sorted(names))}")
    out = {}
    for k, v in d.items():
        if v is None and k == "nvls_eff":
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise InputError(f"{where}.{k}", f"{v!r} is not a non-negative number", "give a number >= 0")
        out[k] = float(v)
    return Calibration(**out)


def write_profile(p: Profile, path: str | Path) -> None:
    write_json_atomic(Path(path), p.to_dict(), indent=1)


def read_profile(path: str | Path) -> Profile:
    """A profile ``flowride calibrate`` wrote; anything else is refused naming the field."""
    where = "--calibration"
    doc = read_json(path, where, "give a profile written by `flowride calibrate -o FILE`, or one of default, nccl, ib, efa")
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise InputError(f"{where} {path}", f"not a calibration profile (schema {doc.get('schema') if isinstance(doc, dict) else None!r})",
                         f"write one with `flowride calibrate`; its schema is {SCHEMA}")
    cal = calibration_from_dict(doc.get("calibration"), f"{path}: calibration")
    cluster = doc.get("cluster") if isinstance(doc.get("cluster"), dict) else {}
    return Profile(cal, cluster, tuple(map(str, doc.get("fitted_on", []))), tuple(map(str, doc.get("fields_fitted", []))),
                   list(doc.get("fit", [])), dict(doc.get("summary", {})))


def dumps(p: Profile) -> str:
    return json.dumps(p.to_dict(), indent=1)
