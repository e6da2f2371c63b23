"""What a store location names: a PostgreSQL URL or a file path (issue 10).

A leaf module: the store factory and the database modules both ask it, so neither has to
import the other.
"""

from __future__ import annotations

import os

URL_SCHEMES = ("postgresql://", "postgres://")


def is_database_url(location: str | os.PathLike[str]) -> bool:
    """Whether ``location`` is a PostgreSQL URL rather than a file path."""
    return isinstance(location, str) and location.startswith(URL_SCHEMES)
