"""The operator console: a browser page for what needs a person, what is at stake, and the decisions.

``effectlog console --journal J`` serves it (extra ``effectlog[console]``: Starlette,
uvicorn, Jinja2, itsdangerous, python-multipart). See docs/console.md.
"""

from __future__ import annotations
