"""Test kits: helpers shared by the test tiers; each module's docstring says what it builds."""
