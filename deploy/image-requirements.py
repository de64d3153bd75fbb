"""Prints the requirements of pyproject.toml (dependencies plus the extras named as arguments), one per
line, for the images' dependency layer: installed from pyproject.toml alone, that layer is rebuilt only
when the dependencies change, not at every change to the code.

    python image-requirements.py pyproject.toml distributed > requirements.txt
"""

import sys

try:
    import tomllib
except ImportError:  # Python 3.10: the TOML reader pip itself uses
    from pip._vendor import tomli as tomllib


def requirements(path: str, extras: list[str]) -> list[str]:
    with open(path, "rb") as file:
        project = tomllib.load(file)["project"]
    found = list(project["dependencies"])
    for extra in extras:
        if extra not in project.get("optional-dependencies", {}):
            raise SystemExit(f"{path}: no optional dependency group [{extra}]")
        found += project["optional-dependencies"][extra]
    return found


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    print("\n".join(requirements(sys.argv[1], sys.argv[2:])))
