"""Agent frameworks as durable sessions (docs/design.md section 12).

Each module wraps one framework on top of ``sessiond.sdk`` (and the ground
floor) only, and imports its framework: install the matching extra
(``pip install 'sessiond[pydantic-ai]'``).
"""
