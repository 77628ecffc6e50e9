"""environment.yml (conda users) says the same as pyproject.toml: every dependency of the package and of the extras
environment.yml names on its `# extras:` line appears there with a compatible spec, and nothing else does."""

from __future__ import annotations

import re

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from conftest import REPO

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _environment() -> tuple[dict[str, Requirement], list[str], list[str]]:
    """({name: pip requirement}, pip lines that are not requirements, the extras the file claims to cover)."""
    text = (REPO / "environment.yml").read_text()
    claim = re.search(r"^# extras: (.+)$", text, re.M)
    assert claim, "environment.yml: add a '# extras: a, b' line naming the pyproject extras it covers"
    deps = yaml.safe_load(text)["dependencies"]
    pip = next(d["pip"] for d in deps if isinstance(d, dict) and "pip" in d)
    reqs, other = {}, []
    for line in pip:
        if line.startswith("-"):
            other.append(line)
            continue
        r = Requirement(line)
        reqs[canonicalize_name(r.name)] = r
    return reqs, other, [x.strip() for x in claim.group(1).split(",")]


def compatible(env: SpecifierSet, package: SpecifierSet) -> bool:
    """The same spec, or an exact pin to a version the package's spec allows."""
    if env == package:
        return True
    pins = [s for s in env if s.operator == "=="]
    return len(pins) == 1 and len(env) == 1 and package.contains(pins[0].version, prereleases=True)


def test_environment_yml_covers_pyproject_with_compatible_specs():
    project = _pyproject()["project"]
    env, other, extras = _environment()
    extra_deps = project["optional-dependencies"]
    unknown = [e for e in extras if e not in extra_deps]
    assert not unknown, f"environment.yml claims extras {unknown} that pyproject.toml does not define"
    wanted = {canonicalize_name(r.name): r for r in map(Requirement, project["dependencies"]
                                                        + [d for e in extras for d in extra_deps[e]])}
    missing = sorted(set(wanted) - set(env))
    assert not missing, f"environment.yml lacks {missing} (pyproject.toml's dependencies or extras {extras})"
    extra = sorted(set(env) - set(wanted))
    assert not extra, f"environment.yml installs {extra}, which pyproject.toml's dependencies and {extras} do not list"
    for name, req in wanted.items():
        assert compatible(env[name].specifier, req.specifier), \
            f"environment.yml has {env[name]}, pyproject.toml {req}: make them agree"
    assert "-e ." in other  # the package itself


def test_compatible_specs():
    assert compatible(SpecifierSet("==2.13.0"), SpecifierSet(">=2.11"))
    assert compatible(SpecifierSet(">=5,<5.20"), SpecifierSet("<5.20,>=5"))
    assert not compatible(SpecifierSet("==2.10.0"), SpecifierSet(">=2.11"))
    assert not compatible(SpecifierSet(">=4"), SpecifierSet(">=4.4"))


def test_python_version_of_environment_yml_is_one_the_package_supports():
    deps = yaml.safe_load((REPO / "environment.yml").read_text())["dependencies"]
    version = next(d.split("=", 1)[1] for d in deps if isinstance(d, str) and d.startswith("python="))
    assert SpecifierSet(_pyproject()["project"]["requires-python"]).contains(version)
