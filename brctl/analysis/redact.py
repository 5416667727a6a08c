"""Redaction: values of secret-looking keys never reach output, logs or saved files."""

from __future__ import annotations

import re
from collections.abc import Mapping

SECRET_KEY = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|KEY|CREDENTIAL|AUTH", re.IGNORECASE)
REDACTED = "***"


def is_secret(key: str) -> bool:
    """Does ``key`` look like it names a secret (TOKEN, SECRET, PASSWORD, KEY, CREDENTIAL)?"""
    return bool(SECRET_KEY.search(key))


def redact_text(text: str, env: Mapping[str, str]) -> str:
    """``text`` with every secret value of ``env`` (at least 4 characters) replaced."""
    for key, value in env.items():
        if is_secret(key) and len(value) >= 4:
            text = text.replace(value, REDACTED)
    return text
