"""The foundation every layer may import: node sets, the schema engine, templates, the
``Node``/connection types and the transport protocol, errors. Standard library only."""
