"""The inventory's per-feature sections, one frozen dataclass each (owned by its feature).

``brctl.analysis.inventory`` builds them with ``brctl.core.schema.from_mapping``,
so a key added here is documented in ``inventory.example.yaml`` and
``man/brctl-inventory.5`` too.
"""
