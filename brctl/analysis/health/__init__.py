"""The health checks, pure: ``checks`` judges every check of a machine's health answer,
``doc`` declares that answer's shape."""
