"""``python -m brctl.schemas [NAME]``: list the JSON Schemas, or print one."""

from __future__ import annotations

import json
import sys

from brctl.schemas import get, names


def main(argv: list[str]) -> int:
    """List every schema name, or print the schema named by the one argument."""
    if not argv:
        for name in names():
            print(name)
        return 0
    try:
        schema = get(argv[0])
    except KeyError:
        sys.stderr.write(f"brctl.schemas: no schema {argv[0]!r}; python -m brctl.schemas "
                         "lists them\n")
        return 2
    print(json.dumps(schema, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
