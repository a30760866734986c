"""Record stores, and how a ``--store`` value selects one.

``--store PATH`` is the default ``sqlite`` store in that file; ``--store NAME:LOCATION`` picks the
registered store ``NAME`` (``memory:``, ``sqlite:runs/a.db``, or a plugin's).
"""

from __future__ import annotations

import re

DEFAULT_STORE = "tunecore.db"


def parse_store_url(url: str | None, store_names: list[str]) -> tuple[str, str]:
    """(store name, location) for a ``--store`` value."""
    url = url or DEFAULT_STORE
    match = re.fullmatch(r"([a-z][a-z0-9_-]*):(.*)", url)
    if match and match.group(1) in store_names:
        return match.group(1), match.group(2)
    return "sqlite", url
