"""scripts/device-wheels.sh ships what the GPU machine's image lacks: every requirement of every package it ships (and
of restartbench, which runs there from the work tree) must be shipped too, on the image, or declared never imported,
and a shipped package's version (the venv's, which the script pins) must meet every specifier asked of it. Read from
this venv's installed metadata: no download."""

import re
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "device-wheels.sh"
#: The GPU image's interpreter, for the requirements' environment markers.
GPU_PYTHON = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
              "platform_system": "Linux", "os_name": "posix", "implementation_name": "cpython",
              "platform_python_implementation": "CPython", "platform_machine": "x86_64", "extra": ""}


def bash_array(name: str, text: str | None = None) -> list[str]:
    text = SCRIPT.read_text() if text is None else text
    found = re.search(rf"^{name}=\(([^)]*)\)", text, re.MULTILINE)
    assert found, f"{SCRIPT} has no array {name}=(...)"
    return [canonicalize_name(word) for word in found.group(1).split()]


def requirements(dist: str) -> list[Requirement]:
    """What ``dist`` needs on the GPU machine: its Requires-Dist whose markers hold there, extras left out."""
    needed = [Requirement(line) for line in metadata.requires(dist) or []]
    return [r for r in needed if r.marker is None or r.marker.evaluate(GPU_PYTHON)]


def missing(shipped: list[str], elsewhere: set[str]) -> list[str]:
    """'package needs requirement' for each requirement of ``shipped`` (and restartbench) that is neither shipped nor
    in ``elsewhere``."""
    covered = set(shipped) | elsewhere
    return [f"{dist} needs {r}" for dist in [*shipped, "restartbench"] for r in requirements(dist)
            if canonicalize_name(r.name) not in covered]


def shipped() -> list[str]:
    return bash_array("PURE") + bash_array("BINARY")


def test_every_shipped_package_has_its_requirements_shipped_or_on_the_image():
    elsewhere = set(bash_array("IMAGE")) | set(bash_array("NOT_IMPORTED"))
    assert missing(shipped(), elsewhere) == []


def test_shipped_versions_meet_every_specifier_asked_of_them():
    names = set(shipped())
    unmet = [f"{dist} needs {r}, the venv (and so .whl/) has {metadata.version(r.name)}"
             for dist in [*shipped(), "restartbench"] for r in requirements(dist)
             if canonicalize_name(r.name) in names and not r.specifier.contains(metadata.version(r.name), True)]
    assert unmet == []


def test_typing_extensions_is_shipped_since_the_images_version_is_unknown():
    """torch brings typing-extensions to the image at a version nobody has read; pydantic wants >= 4.16."""
    pydantic_needs = {canonicalize_name(r.name): r for r in requirements("pydantic")}["typing-extensions"]
    assert "typing-extensions" in shipped() and "typing-extensions" not in bash_array("IMAGE")
    assert pydantic_needs.specifier.contains(metadata.version("typing-extensions"))


def test_a_missing_requirement_is_named():
    """The check itself: without lazy-importer (importlib-metadata 10.2.0 needs it; the image lacks it, so
    ``import torchsnapshot`` failed there) it names the requirement."""
    without = [name for name in shipped() if name != "lazy-importer"]
    elsewhere = set(bash_array("IMAGE")) | set(bash_array("NOT_IMPORTED"))
    assert [line for line in missing(without, elsewhere) if "lazy-importer" in line] == [
        'importlib-metadata needs lazy-importer>=0.1; python_version < "3.15"']


def test_an_array_the_script_lacks_is_refused():
    with pytest.raises(AssertionError, match="no array NOPE"):
        bash_array("NOPE", "PURE=(a b)\n")
